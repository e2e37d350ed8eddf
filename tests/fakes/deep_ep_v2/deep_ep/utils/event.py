"""EventOverlap / EventHandle stand-ins (v2 `deep_ep/utils/event.py`): CPU work is synchronous, waits are no-ops."""
from typing import Any, Optional, Tuple


class EventHandle:
    def current_stream_wait(self) -> None:
        pass


class EventOverlap:
    def __init__(self, event: Optional[EventHandle] = None, extra_tensors: Optional[Tuple] = None) -> None:
        self.event, self.extra_tensors, self._release_handle_by_call = event, extra_tensors, False

    def current_stream_wait(self, release_handle: bool = False) -> None:
        assert self.event is not None
        self.event.current_stream_wait()
        if release_handle:
            self.event = None

    def __call__(self, release_handle: bool = False) -> "EventOverlap":
        self._release_handle_by_call = release_handle
        return self

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, exc_val: Any, exc_tb: Any) -> None:
        if self.event is not None:
            self.event.current_stream_wait()
