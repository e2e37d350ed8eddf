"""The built-in megatron-core training loop, the quick functional check where no Megatron-LM checkout is at
hand (`megatron validate --quick`): the model and one rank's training (train.py), the control and the
candidate each in their own ranks, and their records (loop.py)."""
