"""The worker's consumer sends the main process's buffered task events together: one
flush 50 ms after the first of them, not one at each turn of the event loop."""

from __future__ import annotations

from typing import Any

from tasks import consumer as consumer_module
from tasks.consumer import EVENTS_APART, Consumer


class Hub:
    def __init__(self) -> None:
        self.later: list[tuple[float, Any]] = []

    def call_later(self, delay: float, callback: Any) -> None:
        self.later.append((delay, callback))


class Dispatcher:
    flushes = 0

    def flush(self) -> None:
        self.flushes += 1


def _consumer(hub: Hub | None) -> tuple[Consumer, Dispatcher]:
    consumer = Consumer.__new__(Consumer)  # its bootsteps are not what is tested
    dispatcher = Dispatcher()
    consumer.__dict__.update(hub=hub, event_dispatcher=dispatcher)
    return consumer, dispatcher


def test_buffered_events_are_flushed_once_after_the_first() -> None:
    hub = Hub()
    consumer, dispatcher = _consumer(hub)
    for _ in range(5):  # received, started, succeeded, … of a few tasks
        consumer.on_send_event_buffered()
    assert [delay for delay, _ in hub.later] == [EVENTS_APART] and dispatcher.flushes == 0
    hub.later.pop()[1]()
    assert dispatcher.flushes == 1
    consumer.on_send_event_buffered()  # the next event sets the next flush
    assert len(hub.later) == 1


def test_a_flush_that_never_came_is_set_again(monkeypatch: Any) -> None:
    hub = Hub()
    consumer, _ = _consumer(hub)
    clock = [100.0]
    monkeypatch.setattr(consumer_module.time, "monotonic", lambda: clock[0])
    consumer.on_send_event_buffered()
    hub.later.clear()  # lost: the event loop was reset before it ran
    clock[0] += EVENTS_APART
    consumer.on_send_event_buffered()
    assert hub.later == []  # still in time for the one set
    clock[0] += 3 * EVENTS_APART
    consumer.on_send_event_buffered()
    assert len(hub.later) == 1


def test_without_an_event_loop_celery_flushes_as_it_does() -> None:
    consumer, dispatcher = _consumer(None)
    consumer.on_send_event_buffered()
    assert dispatcher.flushes == 0
