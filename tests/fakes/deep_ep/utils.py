class EventHandle:
    """DeepEP's EventHandle: a recorded CUDA event (nothing to record on CPU ranks)."""

    def __init__(self, *args, **kwargs):
        pass

    def current_stream_wait(self):
        pass


class EventOverlap:
    """DeepEP's EventOverlap(event=None, extra_tensors=None), as Megatron's fused_a2a builds it."""

    def __init__(self, event=None, extra_tensors=None):
        self.event = event

    def current_stream_wait(self):
        pass
