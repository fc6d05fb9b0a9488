"""The trace's scenarios for what a model takes besides tokens: a vision
encoder's images, an audio encoder's inputs, and a multimodal model's towers
(each vision tower through ``get_image_features`` at each image size, then
prompts holding an image's tokens), mixed into ``scenarios.Runner``, whose
inputs and forwards they use. A tower the trace cannot run is noted
(``notes``), never skipped.

May import: media, sizes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import partial
from typing import Any

import torch

from graphcache.models import media
from graphcache.models.sizes import Sizes, batches, padded_words, samples


class MediaScenarios:
    """The media scenarios of ``scenarios.Runner`` (which sets ``model``,
    ``config``, ``text``, ``kind``, ``notes``, ``result``, ``cache_name``,
    ``phase`` and defines ``forward``, ``ids``, ``mask``, ``cache_of``)."""

    model: Any
    config: Any
    text: Any
    kind: str
    notes: dict[str, str]
    result: Any
    cache_name: str
    phase: Callable[[str], None]

    # Runner's own (it overrides each): what these scenarios call.
    def forward(self, phase: str, **kwargs: Any) -> Any:
        raise NotImplementedError

    def ids(self, b: int, n: int) -> torch.Tensor:
        raise NotImplementedError

    def mask(self, b: int, n: int, pad: str) -> torch.Tensor:
        raise NotImplementedError

    def cache_of(self, out: Any) -> Any:
        raise NotImplementedError

    def vision(self, sizes: Sizes, probe: bool) -> None:
        """A vision model's images: the model's own config is the vision
        config (ViT), or holds it (SamModel: its vision_config says the image
        size, and one forward runs the vision encoder and the mask decoder)."""
        sub = self.config
        if media.own_size(sub) is None and getattr(sub, "vision_config", None) is not None:
            sub = sub.vision_config
        for size in self._image_sizes(sizes, sub, "images"):
            for b in [2] if probe else batches(sizes.max_batch):
                kwargs = media.image_call(self.model.forward, sub, size, b, self.model.dtype)
                self.forward(f"images {size[0]}x{size[1]}", **kwargs)

    def audio(self, sizes: Sizes, probe: bool) -> None:
        """An audio encoder's inputs, unpadded and right-padded (as its processor pads)."""
        lens = media.audio_lengths(self.model, sizes.max_seq)
        masked = media.audio_masked(self.config)
        for b in [2] if probe else batches(sizes.max_batch):
            for n in lens[-1:] if probe else lens:
                for pad in ["none", "right"] if b > 1 else ["none"]:
                    kwargs = {self.model.main_input_name: media.audio(self.model, b, n)}
                    if masked:
                        kwargs["attention_mask"] = self.mask(b, n, pad)
                    self.forward(f"audio{padded_words(pad)}", **kwargs)

    def _image_sizes(self, sizes: Sizes, sub: Any, name: str) -> list[tuple[int, int]]:
        own = media.own_size(sub)
        found = list(sizes.image_sizes) or ([own] if own else [])
        if not found:
            self.notes[name] = (
                f"{name} ({getattr(sub, 'model_type', '?')}): its config fixes no image size "
                "(no image_size): pass --image-size HxW for the sizes you serve"
            )
        return found

    def towers(self, sizes: Sizes, probe: bool) -> None:
        """A multimodal model's vision towers (a ``vision_config``) on images
        of each size in batches up to ``max_batch``, then prompts holding an
        image; an audio tower on Whisper-style mel features where its config
        says their size. A tower the trace cannot run is noted (``notes``),
        never skipped."""
        for name in getattr(self.config, "sub_configs", {}) or {}:
            sub = getattr(self.config, name, None)
            if name == "text_config" or sub is None or not ("vision" in name or "audio" in name):
                continue
            what = f"{name} ({getattr(sub, 'model_type', '?')})"
            if "vision" in name:
                self._vision_tower(name, sub, what, sizes, probe)
                continue
            tower = next((m for m in self.model.modules() if getattr(m, "config", None) is sub), None)
            if tower is None:
                self.notes[name] = f"{what}: no module of the model holds this config"
                continue
            try:
                shape = (int(sub.num_mel_bins), 2 * int(sub.max_source_positions))
            except (AttributeError, TypeError, ValueError) as exc:
                self.notes[name] = f"{what}: the trace does not know this tower's input ({exc})"
                continue
            for b in [2] if probe else batches(sizes.max_batch):
                self.phase(f"{name} (audio)")
                features = torch.zeros((b, *shape), dtype=self.model.dtype, device="meta")
                if self._failed(name, what, partial(tower, input_features=features)):
                    break

    def _failed(self, key: str, what: str, call: Callable[[], Any]) -> bool:
        """Run ``call``; where it raises, note why under ``key`` and say so."""
        try:
            with torch.no_grad():
                self.result = call()
            return False
        except Exception as exc:  # noqa: BLE001 - the model's own failure, named
            self.notes[key] = f"{what}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            return True

    def _vision_tower(self, name: str, sub: Any, what: str, sizes: Sizes, probe: bool) -> None:
        """The tower through the model's ``get_image_features`` (its
        projector too, and the grid or sizes it reads), then prompts holding
        an image; where that fails, the module holding its config alone."""
        fn = getattr(self.model, "get_image_features", None)
        module = next((m for m in self.model.modules() if getattr(m, "config", None) is sub), None)
        calls = [c for c in (fn, module) if c is not None]
        if not calls:
            self.notes[name] = f"{what}: no module of the model holds this config"
            return
        for size in self._image_sizes(sizes, sub, name):
            at, key = f"{what} at {size[0]}x{size[1]}", f"{name} {size}"
            per_image = None
            for b in [2] if probe else batches(sizes.max_batch):
                self.phase(f"{name} (images)")
                errors = []
                for call in calls:
                    signature = call.forward if isinstance(call, torch.nn.Module) else call
                    try:
                        kwargs = media.image_call(signature, sub, size, b, self.model.dtype)
                    except ValueError as exc:
                        errors.append(str(exc))
                        continue
                    if not self._failed(key, at, partial(call, **kwargs)):
                        break
                    errors.append(self.notes.pop(key).split(": ", 1)[-1])
                else:
                    self.notes[key] = f"{at}: {'; '.join(errors)}"
                    break
                if call is fn:
                    per_image = media.tokens_per_image(self.result, b)
                elif errors:  # get_image_features failed and the tower ran alone: no image features for a prompt
                    self.notes[f"{key} prompt"] = f"{at}: get_image_features: {errors[0]}; the tower traced alone"
                # else: the model has no get_image_features (SamModel): its tower is all there is to trace
            if per_image is not None and self.kind == "decoder":
                self._prompts_with_images(name, sub, at, size, per_image, sizes, probe)

    def _prompts_with_images(
        self, name: str, sub: Any, at: str, size: tuple[int, int], per_image: int, sizes: Sizes, probe: bool
    ) -> None:
        """Prompts holding one image's tokens (after the first token), the
        image beside them, then a decode step on the cache: text and images
        together, as a server runs a vision-language model."""
        token = media.image_token(self.config)
        if token is None or "pixel_values" not in inspect.signature(self.model.forward).parameters:
            return
        # A prompt one short of each length, then a decode step: kv reaches the length, as decoder() runs it.
        lens = [n - 1 for n in samples(sizes.max_seq, self.text) if n >= per_image + 3]
        if not lens:
            self.notes[f"{name} {size} prompt"] = f"{at}: its {per_image} tokens do not fit --max-seq {sizes.max_seq}"
            return
        for b in [2] if probe else batches(sizes.rows):
            for n in lens[-1:] if probe else lens:
                ids = self.ids(b, n)
                ids[:, 1 : 1 + per_image] = token
                mask = self.mask(b, n, "none")
                kwargs = media.image_call(self.model.forward, sub, size, b, self.model.dtype)
                self.phase("prefill with an image")
                prompt = dict(input_ids=ids, attention_mask=mask, use_cache=True, **kwargs)
                if self._failed(f"{name} {size} prompt", f"{at}, a prompt holding it", partial(self.model, **prompt)):
                    return
                if sizes.decode:
                    grown = torch.cat([mask, torch.ones((b, 1), dtype=mask.dtype, device=mask.device)], dim=1)
                    step = {"input_ids": self.ids(b, 1), "attention_mask": grown, "use_cache": True}
                    step[self.cache_name] = self.cache_of(self.result)
                    self.phase("decode after an image")
                    if self._failed(
                        f"{name} {size} decode", f"{at}, a decode step after it", partial(self.model, **step)
                    ):
                        return
