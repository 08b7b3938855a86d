"""What pays on this machine: matrix products in float32 and each reduced precision, per engine, paired.

A CPU without AVX512-BF16 or AMX runs torch's bfloat16 matmul through a slow path (749 ms against 16 ms for
float32, a 512 x 384 x 1536 product on one thread with ``ATEN_CPU_CAPABILITY=avx2``), and one without VNNI gets
little from int8 (15.7 ms against 16.2 ms). The search reads this once per study (:func:`probe_machine`, stored on
the study so a resumed one reads the same) and orders its presets by it (:mod:`paretorch.pipeline.search.presets`).

How a precision is timed (:func:`paired_gain`), so that no single call decides:

* both products are **warmed** first (:data:`WARM_CALLS` each: a GPU's first bfloat16 product pays for library
  handles, workspaces and kernel selection, and read 0.00x float32 when it was timed);
* then **paired rounds** on the timing service (:mod:`paretorch.pipeline.core.timing`, the rounds a trial is timed
  in, with the probe's warm calls and rounds): per round one block of float32 products and one block of the
  precision's, the order alternating, each block timed on the device's one clock
  (:func:`~paretorch.pipeline.core.timing.clock_for`: events on an accelerator, ``perf_counter_ns`` on the CPU) and
  long enough to load the device (an accelerator runs the product at :data:`ACCELERATOR_SHAPE`, a batch of 256 x 32
  tokens, several times a block);
* the gain is the median of the per-round ratios, its spread their range: with :data:`MIN_ROUNDS` rounds, about
  a 98 % interval of that median. Rounds go on, up to :data:`MAX_ROUNDS`, while the range straddles
  :data:`PAYS`, and stop early (at :data:`MIN_ROUNDS`) only when a precision is so slow that its rounds pass
  :data:`PRECISION_SECONDS`.

A gain whose range clears :data:`PAYS` **decides** (:meth:`MachineProbe.pays`); one whose range straddles it
orders the presets by its median but never drops one: a measured trial decides (:func:`probe_reason`).

Which engine a runtime runs, and that engine's probe, are the runtime's own declaration
(:attr:`paretorch.pipeline.core.runtimes.base.Runtime.engine`,
:meth:`~paretorch.pipeline.core.runtimes.base.Runtime.probe`): torch here (eager and every ``torch.compile`` runtime
share aten's kernels), ONNX Runtime's and OpenVINO's beside their runtimes.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace

import torch

from paretorch.pipeline.core.progress import phase
from paretorch.pipeline.core.stage import config_from_dict, registered_stages
from paretorch.pipeline.core.timing import BlockTimer, Timed, alternate, clock_for

#: The product timed on a CPU: (m, k) @ (k, n), a transformer layer's projection at batch 32 x 16 tokens.
SHAPE = (512, 384, 1536)
#: The product timed on an accelerator: the same layer at batch 256 x 32 tokens (a small one times launches).
ACCELERATOR_SHAPE = (8192, 384, 1536)
#: Untimed calls of each product before any is timed.
WARM_CALLS = 3
#: A timed block runs products until it has lasted at least this long (one product at least).
BLOCK_MS = {"cpu": 20.0, "accelerator": 5.0}
#: Paired rounds per precision: at least, and at most while the spread straddles :data:`PAYS`.
MIN_ROUNDS = 7
MAX_ROUNDS = 15
#: A precision's rounds stop at :data:`MIN_ROUNDS` once they have run this long (a precision 40x slower).
PRECISION_SECONDS = 2.0
#: A reduced precision pays when its product runs at least this much faster than float32.
PAYS = 1.15
#: The engine of a runtime that declares none, and of a stored probe that recorded none.
DEFAULT_ENGINE = "torch"


@dataclass(frozen=True)
class Gain:
    """A precision's speed against float32: the median of per-round ratios and their range."""

    ratio: float
    low: float
    high: float
    rounds: int = 0

    @classmethod
    def exact(cls, ratio: float) -> Gain:
        """A gain known without spread (a precision that cannot run here: 0; an injected one in tests)."""
        return cls(ratio, ratio, ratio)

    def decided(self) -> bool | None:
        """Whether it pays (the whole range at or above :data:`PAYS`), does not (all below), or None (it
        straddles :data:`PAYS`: not decided)."""
        if self.low >= PAYS:
            return True
        if self.high < PAYS:
            return False
        return None


#: An engine's probe: each reduced precision's gain (a float is an exact gain: tests inject them).
EngineProbe = Callable[[], Mapping[str, "Gain | float"]]


@dataclass(frozen=True)
class MachineProbe:
    """Per engine, each reduced precision's median speed against float32 (``{"torch": {"bf16": 2.5}}``) and its
    range (``spreads``, ``[low, high]``); which engine each runtime runs. A missing entry was not measured (no
    kernel, another device); a gain without a range (a probe stored before ranges) orders but decides nothing."""

    gains: dict[str, dict[str, float]] = field(default_factory=dict)
    seconds: float = 0.0
    spreads: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    runtime_engines: dict[str, str] = field(default_factory=dict)

    def engine(self, runtime: str) -> str:
        """The engine whose kernels ``runtime`` runs (as its declaration said when the probe ran)."""
        return self.runtime_engines.get(runtime, DEFAULT_ENGINE)

    def gain(self, runtime: str, precision: str) -> float | None:
        """``precision``'s median speed against float32 under ``runtime``'s engine (None: not measured)."""
        if precision == "fp32":
            return 1.0
        return self.gains.get(self.engine(runtime), {}).get(precision)

    def likely_pays(self, runtime: str, precision: str) -> bool | None:
        """Whether the median says ``precision`` pays under ``runtime`` (None: not measured): for ordering."""
        gain = self.gain(runtime, precision)
        return None if gain is None else gain >= PAYS

    def pays(self, runtime: str, precision: str) -> bool | None:
        """Whether ``precision`` pays under ``runtime`` here with confidence (None: not measured, or its range
        straddles :data:`PAYS`, or no range was stored): for dropping."""
        if precision == "fp32":
            return None
        spread = self.spreads.get(self.engine(runtime), {}).get(precision)
        gain = self.gain(runtime, precision)
        if spread is None or gain is None:
            return None
        return Gain(gain, spread[0], spread[1]).decided()

    def describe(self) -> str:
        """``machine probe (1.9 s, warmed, paired rounds; matmul speed vs fp32): torch bf16 2.49x [2.41, 2.55],
        int8 4.49x [4.30, 4.61]; onnxruntime int8 3.10x [2.2, 3.4] (not decided)``."""
        parts = []
        for engine, gains in self.gains.items():
            if not gains:
                continue
            cells = []
            for precision, ratio in gains.items():
                spread = self.spreads.get(engine, {}).get(precision)
                cell = f"{precision} {ratio:.2f}x"
                if spread is not None and spread[0] != spread[1]:
                    cell += f" [{spread[0]:.2f}, {spread[1]:.2f}]"
                if spread is not None and Gain(ratio, spread[0], spread[1]).decided() is None:
                    cell += " (not decided: trials decide)"
                cells.append(cell)
            parts.append(f"{engine} " + ", ".join(cells))
        return (f"machine probe ({self.seconds:.1f} s, warmed, paired rounds; matmul speed vs fp32): "
                + ("; ".join(parts) if parts else "nothing measured"))

    def to_dict(self) -> dict[str, object]:
        return asdict(self)


def _calls_per_block(one_ms: float, device: torch.device) -> int:
    """How many calls make a block of at least :data:`BLOCK_MS` on this device, from one warm call's milliseconds."""
    target = BLOCK_MS["cpu" if device.type == "cpu" else "accelerator"]
    return max(1, min(1000, int(target / max(one_ms, 1e-3)) + 1))


def paired_gain(reference: Callable[[], object], candidate: Callable[[], object], device: torch.device) -> Gain:
    """``candidate``'s speed against ``reference`` (float32) on ``device``: the timing service's paired rounds
    (:func:`paretorch.pipeline.core.timing.alternate`, each side first in half of them) of equal-length blocks
    (:class:`~paretorch.pipeline.core.timing.BlockTimer`: :data:`WARM_CALLS` warm calls a side first), on the device's
    one clock, from :data:`MIN_ROUNDS` to :data:`MAX_ROUNDS` rounds (see the module docstring)."""
    sides: tuple[Timed, Timed] = ((reference, ()), (candidate, ()))
    timer = BlockTimer(device, calls=1, warm_calls=WARM_CALLS)
    timer.warm_up(sides)
    timer = replace(timer, calls=_calls_per_block(timer(sides[:1])[0], device))
    clock = clock_for(device)
    started = clock.seconds()

    def done(samples: Sequence[Sequence[float]]) -> str | None:
        gain = _gain(*samples)
        if gain.rounds >= MAX_ROUNDS:
            return "round limit"
        if gain.rounds >= MIN_ROUNDS and (gain.decided() is not None or clock.seconds() - started > PRECISION_SECONDS):
            return "decided"
        return None

    return _gain(*alternate(sides, timer, done)[0])


def _gain(reference_ms: Sequence[float], candidate_ms: Sequence[float]) -> Gain:
    """The median of the per-round ratios reference / candidate and their range."""
    ratios = [ref / max(cand, 1e-9) for ref, cand in zip(reference_ms, candidate_ms, strict=True)]
    return Gain(statistics.median(ratios), min(ratios), max(ratios), len(ratios))


def torch_gains(device: torch.device) -> dict[str, Gain]:
    """aten's (and oneDNN's) products on ``device``: bfloat16, float16 on CUDA, int8 where ``torch._int_mm``
    has a kernel (left unmeasured where it has none, not guessed)."""
    m, k, n = SHAPE if device.type == "cpu" else ACCELERATOR_SHAPE
    a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)

    def product(x: torch.Tensor, y: torch.Tensor,
                op: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = torch.mm) -> Callable[[], object]:
        return lambda: op(x, y)

    with torch.no_grad():
        fp32 = product(a, b)
        gains = {"bf16": paired_gain(fp32, product(a.bfloat16(), b.bfloat16()), device)}
        if device.type == "cuda":
            gains["fp16"] = paired_gain(fp32, product(a.half(), b.half()), device)
        qa = torch.randint(-127, 127, (m, k), dtype=torch.int8, device=device)
        qb = torch.randint(-127, 127, (k, n), dtype=torch.int8, device=device)
        try:
            torch._int_mm(qa, qb)
        except RuntimeError:  # no int8 matmul kernel on this device: int8 is left unmeasured, not guessed
            return gains
        gains["int8"] = paired_gain(fp32, product(qa, qb, torch._int_mm), device)
    return gains


def probe_machine(device: torch.device, engines: Mapping[str, EngineProbe] | None = None,
                  runtime_engines: Mapping[str, str] | None = None) -> MachineProbe:
    """Run each engine's probe (``engines``: the study's runtimes' declared probes, one per engine; torch's alone
    when None) and record which engine each runtime runs (``runtime_engines``)."""
    start = time.perf_counter()
    if engines is None:
        engines = {DEFAULT_ENGINE: lambda: torch_gains(device)}
    gains: dict[str, dict[str, float]] = {}
    spreads: dict[str, dict[str, list[float]]] = {}
    with torch.no_grad(), phase(f"machine probe: int8, bf16 and fp16 against float32 on {device.type} "
                                f"({', '.join(engines)})"):
        for engine, measure in engines.items():
            measured = {p: g if isinstance(g, Gain) else Gain.exact(float(g)) for p, g in measure().items()}
            gains[engine] = {p: round(g.ratio, 3) for p, g in measured.items()}
            spreads[engine] = {p: [round(g.low, 3), round(g.high, 3)] for p, g in measured.items()}
    return MachineProbe(gains, time.perf_counter() - start, spreads, dict(runtime_engines or {}))


#: The precisions the probe times against float32 (a stage's other reduced ones: :data:`OTHER`).
PROBED = ("int8", "bf16", "fp16")
#: A chain's precision when a stage lowers it to one the probe does not time (int4 weights, float8).
OTHER = "other"
#: How far each precision lowers a chain's matmuls: a quantization replaces the products a reduced float dtype
#: would run, so it decides (an undeclared name ranks as a quantization).
_DEPTH = {"fp32": 0, "bf16": 1, "fp16": 1}


def stage_precision(stages: tuple[Mapping[str, object], ...]) -> str:
    """The lowest matmul precision a stage list (as dicts) asks for, as its stages declare it
    (:attr:`paretorch.pipeline.core.stage.Stage.precision`): ``int8``, ``bf16``, ``fp16``, ``fp32``, or ``other``
    (a reduced precision the probe does not time, e.g. int4 weights). A stage not installed here declares nothing
    (its chain is not a trial here)."""
    found = "fp32"
    stages_by_name = registered_stages()
    for raw in stages:
        stage = stages_by_name.get(str(raw.get("stage")))
        if stage is None or not stage.lowers_precision:
            continue
        declared = stage.precision_of(config_from_dict(raw)) or "fp32"
        declared = declared if declared in (*PROBED, "fp32") else OTHER
        if _DEPTH.get(declared, 2) >= _DEPTH.get(found, 2):
            found = declared
    return found


def probe_reason(probe: MachineProbe, stages: tuple[Mapping[str, object], ...], runtime: str) -> str | None:
    """Why a stage list (as dicts) is not worth a trial under ``runtime`` on this machine: it reduces the float
    precision (bf16, fp16) to one the probe found, with confidence, does not pay there. None otherwise: a probe
    that did not decide never drops a trial, and int8 that does not pay is tried later, not dropped (its layers
    are not all matmuls)."""
    precision = stage_precision(stages)
    if precision not in ("bf16", "fp16") or probe.pays(runtime, precision) is not False:
        return None
    gain = probe.gain(runtime, precision)
    high = probe.spreads[probe.engine(runtime)][precision][1]
    return (f"the machine probe: {precision} matmul runs {gain:.2f}x float32 under {probe.engine(runtime)} here, "
            f"at most {high:.2f}x over its paired rounds (it pays from {PAYS:.2f}x)")
