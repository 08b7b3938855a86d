"""What the ``mlx`` runtime and its export reproduce of a recipe (declared once, read by both)."""

from __future__ import annotations

from paretorch.extend import TORCHSCRIPT, Reproduces, quant_group, quant_scheme

_FLOAT32 = "the MLX export runs float32 (reduced precision is not wired to MLX here)"
_WEIGHT_ONLY = ("MLX quantizes weights only (mx.quantize, affine per group); activations stay float: weight-only "
                "int8/int4 methods are its mirrors")

#: The group sizes ``mx.quantize`` takes.
GROUP_SIZES = (32, 64, 128)

#: Float32 graphs; int8 and int4 weight-only quantization through MLX's affine ``mx.quantize``.
REPRODUCES = Reproduces(
    precisions=frozenset({"float32"}),
    quantization=frozenset({quant_scheme(8, "float"), quant_scheme(4, "float")}),
    groups=frozenset(quant_group(g) for g in GROUP_SIZES),
    stages=frozenset(),
    outputs=frozenset(),
    notes={
        "bfloat16": _FLOAT32, "float16": _FLOAT32, "auto": _FLOAT32, "mixed": _FLOAT32,
        quant_scheme(8, "dynamic"): _WEIGHT_ONLY, quant_scheme(8, "static"): _WEIGHT_ONLY,
        quant_scheme(None, "float"): "MLX has no float8 weights",
        quant_group(256): f"mx.quantize takes groups of {', '.join(map(str, GROUP_SIZES))} only",
        TORCHSCRIPT: "its export (export.mlx, through torch.export) cannot trace a TorchScript module (use eager)",
    },
)
