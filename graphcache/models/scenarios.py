"""The forwards a trace runs: what a model is asked to do when it serves.

Sizes follow the pow2 class policy (graphcache.spec.classes): batches 1, 2, 4 ...
up to ``max_batch`` times ``beams`` (beam search runs batch x beams rows),
lengths at each length class's longest (128, 256, ... up to ``max_seq``) and
on either side of every window or chunk size the config names (where a call
changes kind: a sliding window comes into reach), since a class's calls are
alike between those. Per batch and length:

- a decoder (a model that returns a cache): a prompt unpadded, left-padded
  and right-padded (batches above 1: the first row is half padding), with
  and without a cache (``use_cache=False``: scoring, embedding), decode
  steps on a cache of each length (unpadded and left-padded, as generate()
  pads), and with ``chunk`` a prompt continued in chunks on a cache; and
  as ``generate(cache_implementation="static")`` runs it (``caches``): a
  transformers ``StaticCache`` of ``max_cache_len`` slots, else of each
  length class's longest up to ``max_seq`` (its sliding-window layers where
  the model has a window), a prompt of each length that leaves it a slot
  (unpadded and left-padded) and decode steps, each step's inputs and mask
  made by the model's own ``prepare_inputs_for_generation``, as generate
  makes them;
- an encoder: its input unpadded, right- and left-padded;
- an encoder-decoder: the encoder as above at each encoder length, and its
  decoder's first step (one token), prompts (with and without a cache) and
  decode steps at each decoder
  length against each encoder length (cross-attention), unpadded or with
  the encoder's input padded; lengths capped at the model's own
  ``max_source_positions`` / ``max_target_positions`` where it has them,
  and a speech encoder's input at the length its config fixes (Whisper:
  ``2 x max_source_positions`` mel frames);
- a vision encoder (ViT, DINOv2, SigLIP's and CLIP's vision models): images
  at each of ``image_sizes`` (default: the config's ``image_size``), never
  padded;
- an audio encoder (wav2vec2, HuBERT, ...): inputs of each length class's
  longest up to ``max_seq`` samples (frames, for ``input_features``),
  unpadded and right-padded, as its processor pads (with a padding mask
  where the processor makes one);
- a multimodal model's towers (graphcache.models.media): each vision tower
  through the model's ``get_image_features`` at each image size, and
  prompts holding an image's tokens with the image beside them (and a
  decode step on their cache), at each length class that holds them.

With ``compiled`` (the default) each runs twice: as eager code runs it,
and as ``torch.compile``'d code does (graphcache.models.compiled), which
hands attention other masks and layouts; the phases of the second say
"(compiled)".

``probe=True`` runs a few of these (batch 2, the longest length): enough
to tell a model's kinds of layers apart
(graphcache.models.stacks).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import nullcontext
from functools import partial
from typing import Any

import torch

from graphcache.models.compiled import compiled_code
from graphcache.models.sizes import Sizes, batches, lengths, padded_words, samples, thresholds
from graphcache.models.towers import MediaScenarios

# The sizes a trace covers are graphcache.models.sizes'; their names are this module's too, as they were.
__all__ = ["Runner", "Sizes", "batches", "lengths", "samples", "thresholds"]


class Runner(MediaScenarios):
    """Calls ``model`` (built on the meta device) as a server would; ``phase``
    is told the phase of each forward before it runs."""

    def __init__(self, model: Any, kind: str, phase: Callable[[str], None]) -> None:
        self.model, self.kind, self.phase = model, kind, phase
        self.config = model.config
        self.text = (
            self.config.get_text_config(decoder=True) if hasattr(self.config, "get_text_config") else self.config
        )
        pad = getattr(self.text, "pad_token_id", None)
        self.token = 2 if pad == 1 else 1
        params = inspect.signature(model.forward).parameters
        self.cache_name = "cache" if "cache" in params else "past_key_values"
        self.features = model.main_input_name == "input_features"
        self.notes: dict[str, str] = {}  # what a tower could not be traced for, by tower
        self.result: Any = None  # the last call _failed made
        self.compiled = False  # the forwards run as torch.compile'd code runs them (graphcache.models.compiled)

    # inputs -------------------------------------------------------------------------

    def ids(self, b: int, n: int) -> torch.Tensor:
        return torch.full((b, n), self.token, dtype=torch.long, device="meta")

    def mask(self, b: int, n: int, pad: str) -> torch.Tensor:
        """(b, n) ones; the first row half padding on the ``pad`` side."""
        mask = torch.ones((b, n), dtype=torch.long, device="meta")
        half = n // 2
        if pad == "left" and b > 1 and half:
            mask[0, :half] = 0
        elif pad == "right" and b > 1 and half:
            mask[0, n - half :] = 0
        return mask

    def input_features(self, b: int) -> torch.Tensor:
        c = self.config
        frames = 2 * int(c.max_source_positions)
        return torch.zeros((b, int(c.num_mel_bins), frames), dtype=self.model.dtype, device="meta")

    # forwards ------------------------------------------------------------------------

    def forward(self, phase: str, **kwargs: Any) -> Any:
        self.phase(f"{phase} (compiled)" if self.compiled else phase)
        with torch.no_grad(), self.code():
            return self.model(**kwargs)

    def code(self) -> Any:
        """Where a forward runs: as compiled code runs it, or as it is."""
        return compiled_code() if self.compiled else nullcontext()

    def cache_of(self, out: Any) -> Any:
        return getattr(out, "cache", None) or getattr(out, "past_key_values", None)

    def decoder(self, sizes: Sizes, probe: bool) -> None:
        if "dynamic" in sizes.caches:
            self.dynamic(sizes, probe)
        if "static" in sizes.caches:
            self.static(sizes, probe)

    def dynamic(self, sizes: Sizes, probe: bool) -> None:
        """A decoder's forwards on transformers' default cache (see the module's text)."""
        rows = [2] if probe else batches(sizes.rows)
        longest = samples(sizes.max_seq, self.text)
        lens = longest[-1:] if probe else longest
        for b in rows:
            pads = ["none", "left", "right"] if b > 1 else ["none"]
            for n in lens:
                for pad in self.pads(pads):
                    mask = None if pad == "unmasked" else self.mask(b, n, pad)
                    self.forward(f"prefill{padded_words(pad)}", input_ids=self.ids(b, n), attention_mask=mask)
                if sizes.decode and n > 1:
                    for pad in self.pads(pads[:2]):
                        self._continue(b, n - 1, 1, pad, f"decode{padded_words(pad)}")
            for q in lengths(sizes.chunk) if sizes.chunk else []:
                for kv in (n for n in lens if n > q):
                    for pad in self.pads(pads[:2]):
                        self._continue(b, kv - q, q, pad, f"chunked prefill{padded_words(pad)}")

    def pads(self, pads: list[str]) -> list[str]:
        """``pads``, and in compiled code "unmasked" too: inputs with no
        padding mask, which compiled code serves otherwise than a mask of
        ones (transformers skips that mask only where it may read it)."""
        return pads + ["unmasked"] if self.compiled else pads

    def static(self, sizes: Sizes, probe: bool) -> None:
        """generate()'s forwards on a static cache (see the module's text):
        caches of ``max_cache_len`` slots (generate's own ``max_cache_len``
        fixes them so), else of each length class's longest up to
        ``max_seq`` (generate sizes a cache to each call's prompt and new
        tokens); a decode step after the longest prompt and after each one
        beside a window (a step's shape is the cache's, whatever the prompt's
        length). Where transformers cannot make or run a static cache for
        the model, why is noted (``notes["static"]``) and the rest traced."""
        from transformers import StaticCache

        caches = [sizes.max_cache_len] if sizes.max_cache_len else lengths(sizes.max_seq)
        for b in [2] if probe else batches(sizes.rows):
            for size in caches[-1:] if probe else caches:
                prompts = samples(size - 1, self.text) if size > 1 else []
                prompts = prompts[-1:] if probe else prompts
                steps = {prompts[-1], *(set(prompts) - set(lengths(size - 1)))} if prompts else set()
                for n in prompts:
                    for pad in ["none", "left"] if b > 1 else ["none"]:
                        try:
                            cache = StaticCache(config=self.text, max_cache_len=size)
                            self._generate_steps(cache, b, n, pad, sizes.decode and n in steps)
                        except Exception as exc:  # noqa: BLE001 - transformers' own refusal, named
                            text = str(exc).splitlines()[0] if str(exc) else ""
                            self.notes["static"] = f"static cache not traced: {type(exc).__name__}: {text}"
                            return

    def _generate_steps(self, cache: Any, b: int, n: int, pad: str, decode: bool) -> None:
        """A prompt of ``n`` tokens on ``cache`` and, with ``decode``, one
        decode step, each with the inputs and mask generate() makes."""
        from transformers import GenerationMixin

        ids, mask = self.ids(b, n), self.mask(b, n, pad)
        # The traced model may be the bare decoder (no generate of its own): generate's own preparation, on it.
        own = getattr(self.model, "prepare_inputs_for_generation", None)
        prepare = own if callable(own) else partial(GenerationMixin.prepare_inputs_for_generation, self.model)
        inputs = prepare(ids, cache=cache, attention_mask=mask, use_cache=True, is_first_iteration=True)
        self.forward(f"static cache prefill{padded_words(pad)}", **inputs)
        if decode:
            ids = torch.cat([ids, ids[:, -1:]], dim=1)
            mask = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=mask.device)], dim=1)
            inputs = prepare(ids, next_sequence_length=1, cache=cache, attention_mask=mask, use_cache=True)
            self.forward(f"static cache decode{padded_words(pad)}", **inputs)

    def _continue(self, b: int, past: int, new: int, pad: str, phase: str) -> None:
        """A prompt of ``past`` tokens, then ``new`` more on its cache
        (``pad`` "unmasked": with no padding mask)."""
        mask = None if pad == "unmasked" else self.mask(b, past, pad)
        out = self.forward(
            f"prefill{padded_words(pad)}", input_ids=self.ids(b, past), attention_mask=mask, use_cache=True
        )
        ones = torch.ones((b, new), dtype=torch.long, device="meta")
        grown = None if mask is None else torch.cat([mask, ones], dim=1)
        kwargs = {self.cache_name: self.cache_of(out)}
        self.forward(phase, input_ids=self.ids(b, new), attention_mask=grown, use_cache=True, **kwargs)

    def encoder(self, sizes: Sizes, probe: bool) -> None:
        rows = [2] if probe else batches(sizes.max_batch)
        longest = samples(sizes.max_seq, self.text)
        lens = longest[-1:] if probe else longest
        for b in rows:
            for n in lens:
                for pad in ["none", "right", "left"] if b > 1 else ["none"]:
                    self.forward(
                        f"encoder{padded_words(pad)}", input_ids=self.ids(b, n), attention_mask=self.mask(b, n, pad)
                    )

    def encoder_decoder(self, sizes: Sizes, probe: bool) -> None:
        c = self.config
        rows = [2] if probe else batches(sizes.rows)
        src_cap = None if self.features else getattr(c, "max_source_positions", None)
        src = [None] if self.features else samples(min(sizes.max_seq, src_cap or sizes.max_seq), c)
        tgt = samples(min(sizes.max_seq, getattr(c, "max_target_positions", None) or sizes.max_seq), c)
        if probe:
            src, tgt = src[-1:], tgt[-1:]
        encoder = self.model.get_encoder()
        for b in rows:
            for n_src in src:
                for pad in ["none"] if self.features or b == 1 else ["none", "right"]:
                    self.phase(f"encoder{padded_words(pad)}")
                    if n_src is None:
                        inputs: dict[str, Any] = {"input_features": self.input_features(b)}
                        mask = None
                    else:
                        mask = self.mask(b, n_src, pad)
                        inputs = {"input_ids": self.ids(b, n_src), "attention_mask": mask}
                    with torch.no_grad(), self.code():
                        encoded = encoder(**inputs)
                    for n in [1] + [n for n in tgt if n > 1]:
                        self._decoder_calls(b, n, encoded, mask, pad, sizes.decode)

    def _decoder_calls(self, b: int, n: int, encoded: Any, mask: Any, pad: str, decode: bool) -> None:
        """The decoder's prompt of ``n`` tokens (its first step where ``n`` is
        1) and, with ``decode``, a decode step on a cache of ``n - 1``."""
        padded = padded_words(pad, "encoder input")
        kwargs = {"encoder_outputs": encoded, "attention_mask": mask, "use_cache": True}
        first = "decoder first step" if n == 1 else "decoder prefill"
        self.forward(f"{first}{padded}", decoder_input_ids=self.ids(b, n), **kwargs)
        self.forward(f"{first}{padded}, no cache", decoder_input_ids=self.ids(b, n), **{**kwargs, "use_cache": False})
        if decode and n > 1:
            out = self.forward(f"decoder prefill{padded}", decoder_input_ids=self.ids(b, n - 1), **kwargs)
            cache = {self.cache_name: self.cache_of(out)}
            self.forward(f"decoder decode{padded}", decoder_input_ids=self.ids(b, 1), **kwargs, **cache)
