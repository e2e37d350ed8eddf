"""Pure definitions, below everything else: what a case is (workload.py), what it must return
(reference.py, the oracle), the bytes it moves (traffic.py, the byte rule), what the links allow
(ceilings.py) and Megatron's names for the backends (megatron_map.py). No process, no GPU state,
no files written; nothing here imports another moebench package."""
