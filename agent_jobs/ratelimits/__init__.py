"""Provider rate limits shared by every worker (`AGENT_JOBS_RATE_LIMITS`).

`rules` reads the setting (keys are `provider:model` globs, the first that matches a
model wins), `buckets` keeps each key's requests and tokens per minute (in Redis, shared
by every process; in process without Redis), `gate` is what a model step meets: it waits
for capacity before its call, a 429's Retry-After pauses its key, and the usage the
provider reports corrects the tokens taken before the call.

Nothing is imported here: the settings read `rules`, which must stay light.
"""
