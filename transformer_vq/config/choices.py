"""Every enumeration of the configs, defined once (torch-free, so that ``tvq --help`` stays fast)."""

HEAD_TYPES = ("shga", "mqa", "mha")
"""'shga': one head (the GAU); 'mqa': query heads sharing one key/value head; 'mha': a key/value head per query head."""
ATTN_TYPES = ("vq", "full", "flash_quad", "flash")
"""'vq': Transformer-VQ; baselines 'full' (softmax, unquantized), 'flash_quad' and 'flash' (FLASH, Hua et al. 2022)."""
BIAS_SPANS = ("window", "block")
"""How far the relative-position bias reaches: 'window' (the whole two-block window, distances up to 2L - 1) or
'block' (distances up to L, the authors' code; keys further back still take part, without the bias)."""
NONCAUSAL_ATTN_TYPES = ("vq", "full")
"""The attention types that have a non-causal (encoder) form."""
REDUCTIONS = ("serial", "matmul", "assoc")
"""How the per-code cache is accumulated across blocks (the paper's App. B and E)."""
ATTN_BACKENDS = ("eager", "triton")
"""How the VQ operator computes whole blocks: 'eager' (torch ops) or 'triton' (fused kernels; docs/operator.md)."""
PRECISIONS = ("float32", "bfloat16")
OPTIMIZERS = ("adamw", "adafactor")
DEVICES = ("auto", "cpu", "cuda")
PARALLELS = ("ddp", "fsdp")
"""How workers share a model: 'ddp' replicates it, 'fsdp' shards it (FSDP2); see docs/distributed.md."""
SPLITS = ("train", "validation", "test")
"""The splits of every corpus."""
CLASSIFY_DATASETS = ("listops", "fashion-mnist", "digits", "cifar10", "pathfinder", "imdb", "aan")
"""The sequence-classification datasets (transformer_vq.data.classify; docs/datasets.md)."""
OP_METHODS = ("vq-serial", "vq-matmul", "vq-assoc", "vq-triton", "vq-qk", "sdpa", "full", "flash", "flash_quad",
              "vq-bidir", "vq-qk-bidir", "sdpa-bidir")
"""Methods of ``tvq bench op``: the VQ operator by reduction, its fused Triton kernels, with quantized queries,
PyTorch's SDPA (no bias), the baselines, and the non-causal forms (transformer_vq.bench.op_methods)."""
EXPORT_FORMATS = ("hf", "safetensors")
"""What ``tvq export`` writes: a Hugging Face ``transformers`` directory, or one model.safetensors + config.json."""
IMAGE_CORPORA = ("imagenet64",)
"""Corpora whose sequences are images of 12,288 raster-order bytes (transformer_vq.data.images): their models sample
images (``tvq sample`` writes PNG files), not text."""
