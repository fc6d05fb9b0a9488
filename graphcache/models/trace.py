"""``graphcache manifest``'s default: every graph a model calls, traced from
the model itself.

The model is built from its config by transformers (graphcache.models.build)
on the meta device: no weights, no GPU, no memory to speak of; the values a
mask function reads on the host are kept beside the meta tensors where they
are small (graphcache.models.shadows). It runs the forwards of
graphcache.models.scenarios through the chosen route (``sdpa``: transformers'
sdpa under ``graphcache.torch.patch()``; ``graphcache``: the graphcache
attention backend) while a recorder notes each attention call as the spec the
drop-in or the backend would look up, or the reason none serves it, with the
layer and phase that made it. Each stack of like layers is first cut to its
shortest prefix holding every kind of layer the probe forwards tell apart
(graphcache.models.stacks), and the cut model is checked to make the probe's
calls again; where it does not, the model runs at full depth.

What a trace writes is what the model calls: the exact calls' length classes
(pow2), each with the layers and phases that call it. Calls no graph serves
are named by feature (softcap, sinks in a padded call, ...), never skipped.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

from graphcache.errors import ManifestError
from graphcache.models import build, scenarios
from graphcache.models.config import ranges
from graphcache.models.specs import ModelSpecs
from graphcache.models.stacks import Cut, Site, Where, cut, kinds_of, stacks
from graphcache.spec import GraphSpec
from graphcache.spec.classes import class_of

Found = Any  # a GraphSpec, or (reason, message)


@dataclass
class Traced:
    """A trace's result: the specs with who calls them (``specs``), how the
    model ran, and the calls no graph serves, by reason."""

    model_type: str
    kind: str  # "decoder", "encoder", "encoder-decoder", "vision encoder" or "audio encoder"
    route: str
    specs: ModelSpecs
    calls: int
    seconds: float
    layers: str  # how the stacks were cut, in words
    refused: dict[tuple[str, str], list[str]] = field(default_factory=dict)
    untraced: list[str] = field(default_factory=list)  # towers the trace could not run, and why
    # The exact calls each class spec serves: their own lengths say what a call is (models.specs.lengthened).
    calls_of: dict[GraphSpec, list[GraphSpec]] = field(default_factory=dict)


def trace(
    data: dict[str, Any], source: str, sizes: scenarios.Sizes, route: str, dtype: str = "bfloat16", cut: bool = True
) -> Traced:
    """Trace the model of config mapping ``data`` (read from ``source``);
    ``cut=False`` runs every layer (the cut, checked, makes the same calls).

    Raises ManifestError naming the extra where torch or transformers is
    missing, transformers' reason where it cannot build the model with the
    route's attention, and every reason where no call can be a graph."""
    started = time.perf_counter()
    config = build.config_of(data, source)
    model = build.model_of(config, route, dtype, source)
    # Values are kept up to the largest padding mask the scenarios make (rows x keys).
    limit = max(1 << 16, 2 * sizes.rows * (sizes.max_seq + (sizes.chunk or 0) + 2))

    def start(phase: Callable[[str], None]) -> tuple[str, Callable[[bool], None], dict[str, str]]:
        kind = _kind(model, scenarios.Runner(model, "", phase))
        if not sizes.max_seq and kind != "vision encoder":
            what = "samples or frames of audio" if kind == "audio encoder" else "tokens"
            raise ManifestError(
                f"{source}: model_type {config.model_type!r} is {'an' if kind[0] in 'aeiou' else 'a'} {kind}: "
                f"pass --max-seq N, the most {what} it takes"
            )
        if sizes.caches == ("static",) and kind != "decoder":
            raise ManifestError(
                f"{source}: --cache static: model_type {config.model_type!r} is "
                f"{'an' if kind[0] in 'aeiou' else 'a'} {kind}, which generate() gives no static cache; leave "
                "--cache out"
            )
        towers = [name for name in getattr(config, "sub_configs", {}) or {} if "vision" in name]
        if sizes.image_sizes and kind != "vision encoder" and not towers:
            raise ManifestError(f"{source}: --image-size: model_type {config.model_type!r} takes no images")
        runner = scenarios.Runner(model, kind, phase)
        return kind, lambda probe: _scenarios(runner, sizes, probe), runner.notes

    traced = run(model, config.model_type, f"model_type {config.model_type!r}", source, route, dtype, limit, cut, start)
    traced.seconds = time.perf_counter() - started
    return traced


def run(
    model: Any,
    name: str,
    what: str,
    source: str,
    route: str,
    dtype: str,
    limit: int,
    cut_layers: bool,
    start: Callable[[Callable[[str], None]], tuple[str, Callable[[bool], None], dict[str, str]]],
) -> Traced:
    """Run a model's scenarios under the recorder and collect what it calls.

    ``start(phase)`` (called inside the recording, on the meta device with
    shadows of up to ``limit`` elements) gives the model's kind, its
    scenarios (``probe``: the few that tell its layers apart) and the notes
    its towers leave; ``what`` names the model in errors. Shared by
    transformers' models (``trace``) and diffusers' (graphcache.models.diffusion)."""
    started = time.perf_counter()
    from graphcache.models.shadows import Shadows
    from graphcache.torch.recording import Recorder

    class _Noting(Recorder):
        """Notes each call with its site and phase as well."""

        def __init__(self) -> None:
            super().__init__(dtype, "pow2")
            self.phase = ""
            self.site: Any = lambda: None
            self.noted: list[tuple[Site | None, str, Found]] = []

        def count(self, found: Found, wide: dict[str, str] | None = None) -> None:
            super().count(found, wide)
            self.noted.append((self.site(), self.phase, found))

    recorder = _Noting()
    where = Where(model)
    recorder.site = where.site

    def phase(text: str) -> None:
        recorder.phase = text
        where.reset()

    try:
        with _recording(recorder, route), Shadows(limit):
            kind, scenario, notes = start(phase)
            layers, plan = _run(scenario, recorder, model, cut_layers)
    except ManifestError:
        raise
    except Exception as exc:  # noqa: BLE001 - the model's own failure on the meta device, named
        text = str(exc).splitlines()[0] if str(exc) else ""
        step = f"its step {recorder.phase!r}" if recorder.phase else "its first forward"
        raise ManifestError(
            f"{source}: {what} is not covered: the trace cannot run {step} ({type(exc).__name__}: {text}): "
            "record a run with graphcache record"
        ) from None
    finally:
        where.remove()
    if route == "graphcache" and not recorder.noted:
        raise build.no_backend(name, source)
    specs, refused = _collect(recorder.noted, plan)
    took = time.perf_counter() - started
    traced = Traced(name, kind, route, specs, len(recorder.noted), took, layers, refused, list(notes.values()))
    for _, _, found in recorder.noted:
        if isinstance(found, GraphSpec):
            calls = traced.calls_of.setdefault(class_of(found, "pow2"), [])
            if found not in calls:
                calls.append(found)
    if not traced.specs.users:
        reasons = "; ".join(f"{code}: {message}" for code, message in traced.refused) or "no attention call was made"
        raise ManifestError(f"{source}: no attention call of {what} can be a graph: {reasons}")
    return traced


@contextmanager
def _recording(recorder: Any, route: str) -> Iterator[None]:
    import graphcache.torch as gt

    with gt.patch() if route == "sdpa" else nullcontext():
        gt.RUNTIME.recorders.append(recorder)
        try:
            yield
        finally:
            if recorder in gt.RUNTIME.recorders:
                gt.RUNTIME.recorders.remove(recorder)


def _kind(model: Any, runner: scenarios.Runner) -> str:
    """decoder (a forward returns a cache), encoder, encoder-decoder, or a
    vision or audio encoder (a model whose input is images or audio)."""
    if getattr(model.config, "is_encoder_decoder", False):
        return "encoder-decoder"
    if model.main_input_name == "pixel_values":
        return "vision encoder"
    if model.main_input_name in ("input_values", "input_features"):
        return "audio encoder"
    try:
        out = runner.forward(
            "kind", input_ids=runner.ids(1, 2), attention_mask=runner.mask(1, 2, "none"), use_cache=True
        )
    except TypeError:
        return "encoder"
    cache = runner.cache_of(out)
    return "decoder" if cache is not None and cache.get_seq_length() > 0 else "encoder"


def _scenarios(runner: scenarios.Runner, sizes: scenarios.Sizes, probe: bool) -> None:
    for compiled in (False, True) if sizes.compiled else (False,):
        runner.compiled = compiled
        try:
            _kind_scenarios(runner, sizes, probe)
        finally:
            runner.compiled = False
    runner.towers(sizes, probe)


def _kind_scenarios(runner: scenarios.Runner, sizes: scenarios.Sizes, probe: bool) -> None:
    if runner.kind == "decoder":
        runner.decoder(sizes, probe)
    elif runner.kind == "encoder":
        runner.encoder(sizes, probe)
    elif runner.kind == "vision encoder":
        runner.vision(sizes, probe)
    elif runner.kind == "audio encoder":
        runner.audio(sizes, probe)
    else:
        runner.encoder_decoder(sizes, probe)


def _run(scenario: Callable[[bool], None], recorder: Any, model: Any, cut_layers: bool) -> tuple[str, Cut]:
    """Probe at full depth, cut, check the cut, then run every scenario."""
    recorder.noted.clear()
    lengths = {path: len(stack) for path, stack in stacks(model).items()}
    if not cut_layers:
        scenario(False)
        kinds = kinds_of([(site, found) for site, _, found in recorder.noted], lengths).kinds
        return _depth(Cut(lengths, dict(lengths), kinds), "full depth (asked)"), Cut(lengths, dict(lengths), kinds)
    scenario(True)
    probe = [(site, found) for site, _, found in recorder.noted]
    seen = _calls(recorder.noted)
    plan = kinds_of(probe, lengths)
    full = Cut(lengths, dict(lengths), plan.kinds)
    if not plan.changed:
        recorder.noted.clear()
        scenario(False)
        return _depth(full, "full depth (each layer a kind of its own)"), full
    recorder.noted.clear()
    with cut(model, plan):
        try:
            scenario(True)
            same = _calls(recorder.noted) == seen
        except Exception:  # noqa: BLE001 - a model that cannot run cut runs at full depth
            same = False
        recorder.noted.clear()
        if same:
            scenario(False)
            return _depth(plan, "cut to the prefix holding one layer of each kind"), plan
    scenario(False)
    return _depth(full, "full depth (the cut model called otherwise)"), full


def _calls(noted: list[tuple[Site | None, str, Found]]) -> set[tuple[str, str, str, Found]]:
    return {(s.stack if s else "", s.attention if s else "", phase, found) for s, phase, found in noted}


def _depth(plan: Cut, how: str) -> str:
    """``cut to ... (layers: 1 of 32)``: how the model ran, per stack."""
    stacks_text = ", ".join(f"{path}: {plan.kept[path]} of {plan.lengths[path]}" for path in plan.lengths)
    return f"{how} ({stacks_text})" if stacks_text else how


def _collect(
    noted: list[tuple[Site | None, str, Found]], plan: Cut
) -> tuple[ModelSpecs, dict[tuple[str, str], list[str]]]:
    """Each class spec with who calls it; each reason with who makes such calls."""
    users: dict[Any, dict[tuple[str, str], list[str]]] = {}
    for site, phase, found in noted:
        klass = class_of(found, "pow2") if isinstance(found, GraphSpec) else found
        who = _who(site, plan)
        phases = users.setdefault(klass, {}).setdefault(who, [])
        if phase not in phases:
            phases.append(phase)
    specs = ModelSpecs()
    refused: dict[tuple[str, str], list[str]] = {}
    for klass, by_who in users.items():
        lines = [f"{who[0]}{who[1]}: {', '.join(sorted(phases))}" for who, phases in by_who.items()]
        if isinstance(klass, GraphSpec):
            for line in lines:
                specs.add(klass, line)
        else:
            refused[klass] = lines
    return specs, refused


def _who(site: Site | None, plan: Cut) -> tuple[str, str]:
    if site is None:
        return ("model", "")
    if site.layer < 0:  # an attention module outside any stack: its path
        return (site.stack, "")
    members = plan.members(site.stack, site.layer)
    attention = f" {site.attention}" if site.attention else ""
    return (f"{site.stack} {ranges(members)}", attention)
