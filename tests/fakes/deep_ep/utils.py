class EventOverlap:
    pass


class EventHandle:
    pass
