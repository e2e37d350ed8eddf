"""What this machine has, read without side effects: the CUDA toolkit and Python packages
(toolkit.py), how DeepEP/HybridEP were built (buildkind.py), the GPUs and their links
(topology.py). Imports nothing else of moebench."""
