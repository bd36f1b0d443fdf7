"""Data parallelism: the process group of a ``torchrun`` launch and DDP (``distributed.py``), FSDP2's sharding
(``fsdp.py``). The trainer uses both; checkpointing never imports them."""
