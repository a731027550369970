"""Notifications: a run that ends or starts waiting for a person tells the world.

The change and its notification are one transaction (`outbox`: the event shapes and
the writes the status changes of `store/runs.py` make); a sender in every long-lived
process delivers each row at least once, to the Redis Stream `agent_jobs:events` and to
a webhook (`sender`, `webhook`), woken at once by a commit of its own process (`wake`)
and polling for the rows of others.
"""
