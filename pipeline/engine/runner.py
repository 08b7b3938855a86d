"""Run a :class:`~paretorch.pipeline.engine.graph.Pipeline` in topological order, through the node cache.

For each trial the runner gets one config per stage node (``None`` = off: the
node passes its input through, under its input's key) and a runtime. Model
stages get a deep copy of their input (``paretorch.pipeline.core.stage.apply_stage``);
export stages also get ``ctx.float_model`` (the output of the last
non-numeric stage: the float graph that Core ML and ONNX convert) and
``ctx.upstream`` (the resolved configs before them, which they mirror).
Evaluation nodes measure a model with :func:`paretorch.pipeline.core.evaluate.evaluate_model`
or report what an exporter checked. Every runtime is prepared the same way (:meth:`Runner._prepared`): it
gets the built model and a lazy handle to the export it declares
(:class:`paretorch.pipeline.engine.exported.LazyExport`); a runtime that asks the handle for its file (``onnxruntime``,
``openvino``, a plugin's) gets it through the same export cache (so once per stage prefix), and what it
opened is kept per file; the file's size is the model's size, and opening it is timed apart
(``runtime_sessions``).

What a run produced travels in the :class:`~paretorch.pipeline.engine.run_result.RunResult` it returns, nothing is left
on the runner for a later call to read: an evaluation that ran hands back the function it measured
(:attr:`RunResult.prepared <paretorch.pipeline.engine.run_result.RunResult.prepared>`, so a search times that very
function again without compiling it twice), and the seconds of its side work (an exported runtime's export and
session) come back with its node (:attr:`NodeResult.side_seconds
<paretorch.pipeline.engine.run_result.NodeResult.side_seconds>`).

Scripted chains (:func:`run_chain`) are this runner over a chain pipeline, so a
script and a search trial run a recipe the same way.
"""

from __future__ import annotations

import copy
import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path

import torch
from torch import Tensor, nn

from paretorch.pipeline.core.device import move_module
from paretorch.pipeline.core.errors import ConfigError, InfeasibleConfig
from paretorch.pipeline.core.evaluate import Known, LatencySettings, evaluate_model
from paretorch.pipeline.core.input_agreement import Reference
from paretorch.pipeline.core.latency import default_latency
from paretorch.pipeline.core.names import DEFAULT_RUNTIME
from paretorch.pipeline.core.padding import LATENCY_INPUTS
from paretorch.pipeline.core.paths import cache_dir, results_dir
from paretorch.pipeline.core.runtimes.base import Runtime
from paretorch.pipeline.core.runtimes.registry import get_runtime, prepare_runtime
from paretorch.pipeline.core.spec import ModelSpec, load_model
from paretorch.pipeline.core.stage import (
    ExportResult,
    StageConfig,
    StageContext,
    StageOutput,
    apply_stage,
    config_from_dict,
    get_stage,
)
from paretorch.pipeline.engine.cache import (
    CachedOutput,
    NodeCache,
    model_bytes,
    model_digest,
    model_libraries,
    node_key,
    runtime_libraries,
    stage_libraries,
)
from paretorch.pipeline.engine.exported import LazyExport, OpenSessions, exported_report
from paretorch.pipeline.engine.graph import Pipeline
from paretorch.pipeline.engine.run_result import NodeResult, RunResult, StageTally

#: Time categories of a run: stage work, measurement, exports, opening exported files in their runtime.
TIME_CATEGORIES = ("model_load", "stages", "evaluation", "exports", "runtime_sessions")


class Runner:
    """Executes one pipeline for one spec on one device, caching node outputs across runs."""

    def __init__(
        self,
        pipeline: Pipeline,
        spec: ModelSpec,
        device: torch.device,
        cache: NodeCache | None = None,
        latency: LatencySettings = default_latency(),
        batch_sizes: tuple[int, ...] | None = None,
        work_dir: Path | None = None,
        model: nn.Module | None = None,
        reference: Callable[[], Reference] | None = None,
    ) -> None:
        self.pipeline = pipeline
        #: The unoptimized model's outputs on the evaluation (computed on first use, once): every evaluation is then
        #: compared with them input by input (:mod:`paretorch.pipeline.core.input_agreement`); None: no per-input view.
        self.reference = reference
        self.spec = spec
        self.device = device
        self.cache = cache if cache is not None else NodeCache(export_dir=cache_dir("exports"))
        self.latency = latency
        self.batch_sizes = batch_sizes
        self.work_dir = work_dir or results_dir() / "work"
        #: Per model stage, over this runner's life: runs, cache hits and seconds (e.g. distillation,
        #: paid once per distinct prefix).
        self.stage_tallies: dict[str, StageTally] = {}
        #: Open sessions of exported runtimes by export key.
        self._sessions = OpenSessions()
        #: Seconds spent per category over this runner's life, failed runs included.
        self.totals: dict[str, float] = dict.fromkeys(TIME_CATEGORIES, 0.0)
        start = time.perf_counter()
        self.model = model if model is not None else load_model(spec)
        self.source_key = node_key("model", {"spec": spec.name, "weights": model_digest(self.model)}, (), device.type,
                                   model_libraries(self.model))
        self.totals["model_load"] = time.perf_counter() - start

    # ------------------------------------------------------------------ public

    def run(
        self,
        configs: Mapping[str, StageConfig | None] | None = None,
        runtime: str = DEFAULT_RUNTIME,
        exports: bool = True,
        evaluate: bool = True,
        known: Known | None = None,
    ) -> RunResult:
        """Run every node (``exports=False``: skip exports and what reads them;
        ``evaluate=False``: skip the evaluations of torch models). ``known``: what the objective's evaluation
        already has (:class:`~paretorch.pipeline.core.evaluate.Known`: the model prepared by :meth:`prepared_run`, not
        compiled again; its latency; its outputs), not measured again.

        ``configs`` gives a config (or ``None`` = off) per stage node; a node
        missing from it uses its fixed config, or is off.
        """
        configs = self._checked(configs)
        skipped = set() if exports else self.pipeline.downstream_of_exports()
        hits0, misses0 = self.cache.stats.total_hits, self.cache.stats.total_misses
        seconds = dict.fromkeys(TIME_CATEGORIES, 0.0)
        results: dict[str, NodeResult] = {}
        for node in self.pipeline:
            if node.name in skipped:
                continue
            kind = self.pipeline.kind(node.name)
            if kind == "evaluate" and not evaluate and self.pipeline.kind(node.inputs[0]) != "export":
                continue
            category = {"evaluate": "evaluation", "export": "exports"}.get(kind, "stages")
            start = time.perf_counter()
            result: NodeResult | None = None
            try:
                if kind == "source":
                    result = NodeResult(node.name, kind, self.source_key, self.model, float_model=self.model)
                elif kind == "evaluate":
                    objective = node.name == self.pipeline.objective_node().name
                    result = self._evaluate(node.name, results[node.inputs[0]], runtime, configs,
                                            known if objective else None)
                else:
                    config = configs.get(node.name, node.config)
                    result = self._stage(node.name, kind, config, results[node.inputs[0]])
            finally:
                elapsed = time.perf_counter() - start
                side = result.side_seconds if result is not None else {}
                for side_category, side_elapsed in {category: elapsed - sum(side.values()), **side}.items():
                    seconds[side_category] += side_elapsed
                    self.totals[side_category] += side_elapsed
            result.seconds = elapsed
            results[node.name] = result
        return RunResult(
            pipeline=self.pipeline,
            runtime=runtime,
            nodes=results,
            seconds=seconds,
            cache_hits=self.cache.stats.total_hits - hits0,
            cache_misses=self.cache.stats.total_misses - misses0,
            configs=configs,
        )

    def prepare(self, configs: Mapping[str, StageConfig | None], runtime: str) -> Callable[..., Tensor]:
        """The objective's model of ``configs`` (from the cache where it is there) prepared for ``runtime``
        (what it opened from its export reused). Outside a run: the caller counts its seconds (as evaluation)."""
        return self.prepared_run(configs, runtime)[0]

    def prepared_run(self, configs: Mapping[str, StageConfig | None],
                     runtime: str) -> tuple[Callable[..., Tensor], RunResult]:
        """:meth:`prepare`, with the run of the stages that made the model (its seconds and cache hits)."""
        result = self.run(configs, runtime, exports=False, evaluate=False)
        parent = result.nodes[self.pipeline.objective_node().inputs[0]]
        fn, _, _ = self._prepared(get_runtime(runtime), parent, configs)
        return fn, result

    def _checked(self, configs: Mapping[str, StageConfig | None] | None) -> dict[str, StageConfig | None]:
        """``configs`` as a dict, each naming a stage node of the pipeline (else a :class:`ConfigError`)."""
        configs = dict(configs or {})
        unknown = [name for name in configs if name not in self.pipeline or not self.pipeline.node(name).is_stage]
        if unknown:
            raise ConfigError(f"no stage node named {', '.join(unknown)} in pipeline '{self.pipeline.name}' "
                              f"(stage nodes: {', '.join(n.name for n in self.pipeline.stage_nodes())})")
        return configs

    def runtime_file(self, configs: Mapping[str, StageConfig | None], runtime: str) -> ExportResult | None:
        """The export ``runtime`` declares for ``configs`` (from the export cache where it is there), the one its
        trial ran; None for a runtime that declares none. Outside a run: the caller counts its seconds."""
        if get_runtime(runtime).export is None:
            return None
        result = self.run(configs, runtime, exports=False, evaluate=False)
        parent = result.nodes[self.pipeline.objective_node().inputs[0]]
        return self._export_handle(get_runtime(runtime), parent, configs).result()

    # ------------------------------------------------------------------ nodes

    def _context(self, parent: NodeResult, output_dir: Path | None, with_float_model: bool) -> StageContext:
        float_model = None
        if with_float_model and parent.float_model is not None:
            float_model = copy.deepcopy(parent.float_model)  # an exporter may trace or cast it
        return StageContext(spec=self.spec, device=self.device, output_dir=output_dir,
                            upstream=parent.chain, records={}, float_model=float_model, input_key=parent.key,
                            source_model=self.model, latency=self.latency, latency_batch_sizes=self.batch_sizes)

    def _stage(self, name: str, kind: str, config: StageConfig | None, parent: NodeResult) -> NodeResult:

        if config is None:
            # Off: pass the input through under its own key (so "off" shares every cache entry).
            value = parent.value if kind == "model" else None
            return NodeResult(name, kind, parent.key, value, chain=parent.chain, float_model=parent.float_model)
        stage = self.pipeline.stage(name)
        if not isinstance(config, stage.config_type):
            raise ConfigError(f"node '{name}' runs stage '{stage.name}' but got a {type(config).__name__}")
        key = node_key(stage.name, config.to_dict(), (parent.key,), self.device.type, stage_libraries(stage))
        if kind == "export":
            return self._export(name, key, config, parent)
        tally = self.stage_tallies.setdefault(stage.name, StageTally())
        cached = self.cache.get(key, "model")
        if cached is None:
            ctx = self._context(parent, self.work_dir / "stages" / key, with_float_model=False)
            start = time.perf_counter()
            model = _apply_node(name, config, parent, ctx)
            if not isinstance(model, nn.Module):
                raise TypeError(f"stage '{stage.name}' returned a {type(model).__name__}, not a torch.nn.Module")
            tally.runs += 1
            tally.seconds += time.perf_counter() - start
            cached = CachedOutput(model, ctx.resolved_config, dict(ctx.records), model_bytes(model))
            self.cache.put(key, cached)
            hit = False
        else:
            tally.hits += 1
            hit = True
        resolved = cached.resolved_config or config
        float_model = parent.float_model if stage.numeric else cached.value
        return NodeResult(name, kind, key, cached.value, config, resolved, hit,
                          chain=(*parent.chain, resolved), float_model=float_model, records=cached.records)

    def _export(self, name: str, key: str, config: StageConfig, parent: NodeResult) -> NodeResult:
        cached = self.cache.get_export(key)
        hit = cached is not None
        if cached is None:
            staging = self.cache.staging_dir(key)
            try:
                ctx = self._context(parent, staging, with_float_model=True)
                result = _apply_node(name, config, parent, ctx)
                if not isinstance(result, ExportResult):
                    raise TypeError(f"export stage '{config.stage}' returned a {type(result).__name__}, "
                                    "not an ExportResult")
                entry = CachedOutput(result, ctx.resolved_config, dict(ctx.records))
                cached = self.cache.commit_export(key, staging, entry)
            except BaseException:  # infeasible, failed or Ctrl-C: no half-written folder stays behind
                self.cache.discard_staging(staging)
                raise
        resolved = cached.resolved_config or config
        return NodeResult(name, "export", key, cached.value, config, resolved, hit,
                          chain=(*parent.chain, resolved), records=cached.records)

    def _evaluate(self, name: str, parent: NodeResult, runtime: str, configs: Mapping[str, StageConfig | None],
                  known: Known | None = None) -> NodeResult:
        if parent.kind == "export":
            return NodeResult(name, "evaluate", parent.key, _export_evaluation(parent.value))
        settings: dict[str, object] = {"runtime": runtime, "latency": asdict(self.latency),
                                    "batch_sizes": self.batch_sizes, "latency_inputs": LATENCY_INPUTS}
        handle = self._export_handle(get_runtime(runtime), parent, configs)
        if handle.config is not None:
            settings["export"] = handle.config.to_dict()
        if self.reference is not None:
            settings["per_input_cosine_floor"] = self.reference().cosine_floor
        key = node_key("evaluate", settings, (parent.key,), self.device.type, runtime_libraries(get_runtime(runtime)))
        cached = self.cache.get(key, "evaluation")
        if cached is not None:  # the export the runtime ran, as its stage resolved it (an ``auto`` decided)
            return NodeResult(name, "evaluate", key, cached.value, cached=True,
                              runtime_export=cached.resolved_config or handle.config)
        known = known or Known()
        if self.reference is not None and known.reference is None:
            known = dataclasses.replace(known, reference=self.reference())
        if get_runtime(runtime).compiles and known.fn is None:
            # Fresh dynamo state: many models of one class would otherwise hit the
            # recompile limit and silently run eager.
            torch.compiler.reset()
        model = move_module(parent.value, self.device).eval()
        fn, handle, side = self._prepared(get_runtime(runtime), parent, configs)
        report = evaluate_model(model, self.spec, self.device, runtime=runtime, settings=self.latency,
                                batch_sizes=self.batch_sizes, fn=known.fn or fn, known=known)
        export_config = handle.resolved or handle.config
        if handle.used:
            report = exported_report(report, handle.result(), fn, side.get("runtime_sessions", 0.0))
        self.cache.put(key, CachedOutput(report, resolved_config=export_config, nbytes=0))
        return NodeResult(name, "evaluate", key, report, runtime_export=export_config, prepared=known.fn or fn,
                          side_seconds=side)

    def _prepared(self, runtime: Runtime, parent: NodeResult, configs: Mapping[str, StageConfig | None]
                  ) -> tuple[Callable[..., Tensor], LazyExport, dict[str, float]]:
        """``parent``'s model prepared by ``runtime`` with a lazy handle to its export; what a runtime opened from
        its export is kept per file (:class:`OpenSessions`). Also the handle and this call's side seconds:
        the export's (``exports``) and the rest of the preparation's (``runtime_sessions``), when it read it."""
        handle = self._export_handle(runtime, parent, configs)
        kept = self._sessions.kept((runtime.name, handle.key))
        if kept is not None:
            handle.result()  # an export cache hit: the file the kept session opened
            return kept, handle, {"exports": handle.seconds}
        start = time.perf_counter()
        model = move_module(parent.value, self.device).eval()
        fn = prepare_runtime(model, runtime.name, self.device, handle)
        if not handle.used:
            return fn, handle, {}
        self._sessions.keep((runtime.name, handle.key), fn)
        return fn, handle, {"exports": handle.seconds,
                            "runtime_sessions": time.perf_counter() - start - handle.seconds}

    def _export_handle(self, runtime: Runtime, parent: NodeResult,
                       configs: Mapping[str, StageConfig | None]) -> LazyExport:
        """The lazy handle to the export ``runtime`` declares of ``parent``'s model: the pipeline's node of that
        stage off the same model (this run's config), else the stage's defaults, with the runtime's settings;
        made through the export cache on first use."""
        declared = runtime.export
        if declared is None:
            return LazyExport(runtime.name)
        base: StageConfig | None = None
        for node in self.pipeline.export_nodes():
            if node.op == declared.stage and node.inputs == (parent.name,):
                base = configs.get(node.name, node.config)
        if base is None:
            base = get_stage(declared.stage).config_type()
        config = config_from_dict({**base.to_dict(), **declared.settings})
        key = node_key(declared.stage, config.to_dict(), (parent.key,), self.device.type,
                       stage_libraries(get_stage(declared.stage)))
        return LazyExport(runtime.name, config, key, lambda: self._export(f"runtime.{declared.stage}", key, config,
                                                                          parent))


def _export_evaluation(result: ExportResult | None) -> dict[str, object] | None:
    """What an exporter checked about its file (metrics it measured, how it validated)."""
    if result is None:
        return None
    return {"format": result.format, "size_bytes": result.size_bytes, "validation": result.validation,
            **result.metrics}


def _apply_node(name: str, config: StageConfig, parent: NodeResult, ctx: StageContext) -> StageOutput:
    """Apply one node's stage; errors say which node and config they came from."""
    try:
        return apply_stage(parent.value, config, ctx)
    except InfeasibleConfig as exc:
        raise _with_node(exc, name) from exc
    except Exception as exc:
        exc.add_note(f"while running pipeline node '{name}' ({config.stage}) with {config.describe()}")
        raise


def _with_node(exc: InfeasibleConfig, node: str) -> InfeasibleConfig:
    reason = exc.reason if exc.reason.startswith(f"{node}:") else f"{node}: {exc.reason}"
    return InfeasibleConfig(reason)
