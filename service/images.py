"""Chat prompts with images: image content parts -> encoded images -> prompt ids with
each image's [IMG] / [IMG_BREAK] / [IMG_END] layout, and the PromptImages the engine
scatters into prefill. CPU work: routes call :func:`encode_chat_prompt` through the
thread pool, so image encoding runs ahead of scheduling (engine/vision/runtime.py).

Refused with 400 (param names the part): image parts outside user messages, more images
than --limit-mm-per-prompt, a checkpoint without a vision tower (or image=0), an image
URL the media policy refuses (service/media.py), bytes that do not decode."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.backend import ServingState
from service.errors import APIError
from service.media import MediaPolicy, load_media
from service.prompts import IMAGE_PART_TYPES, encode_chat
from service.schemas import ChatMessage
from service.tool_calls.plan import ChatPlan


@dataclass(frozen=True, slots=True)
class ImagePart:
    param: str  # e.g. messages[1].content[0]
    url: Any


def _url(part: dict[str, Any]) -> Any:
    """The URL of an image part: image_url {"url": ...} or "..." (also input_image)."""
    value = part.get("image_url", part.get("image"))
    return value.get("url") if isinstance(value, dict) else value


def image_parts(messages: Sequence[ChatMessage]) -> list[ImagePart]:
    """Every image part in order; 400 for one outside a user message."""
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m.content, list):
            continue
        for j, part in enumerate(m.content):
            if part.get("type") not in IMAGE_PART_TYPES:
                continue
            param = f"messages[{i}].content[{j}]"
            if m.role != "user":
                raise APIError(400, f"image parts are accepted in user messages only "
                               f"(messages[{i}] is {m.role!r})", param)
            out.append(ImagePart(param, _url(part)))
    return out


def _vision(state: ServingState, parts: Sequence[ImagePart]) -> Any:
    """The vision tower, or a 400 naming the first image part it cannot take."""
    vision = getattr(state.backend, "vision", None)
    if vision is None:
        why = getattr(state.backend, "vision_off_reason", None) or "no vision tower"
        raise APIError(400, f"{parts[0].param}: this model does not take images ({why})",
                       parts[0].param)
    limit = vision.limits.max_images
    if len(parts) > limit:
        raise APIError(400, f"{parts[limit].param}: {len(parts)} images in the prompt; this "
                       f"server takes at most {limit} (--limit-mm-per-prompt)",
                       parts[limit].param)
    return vision


def policy_of(state: ServingState) -> MediaPolicy:
    s = state.settings
    return MediaPolicy(allowed_domains=tuple(s.allowed_media_domains),
                       fetch_timeout=s.media_fetch_timeout, max_bytes=s.max_media_bytes,
                       local_root=s.allowed_local_media_path)


def encode_chat_prompt(state: ServingState, messages: Sequence[ChatMessage],
                       add_generation_prompt: bool = True, plan: ChatPlan | None = None
                       ) -> tuple[list[int], tuple[Any, ...]]:
    """(prompt ids, PromptImages in prompt order); no images: encode_chat's ids, ()."""
    from engine.vision.decode import ImageDecodeError
    from engine.vision.layout import expand_images
    from engine.vision.prompt_image import PromptImage

    parts = image_parts(messages)
    if not parts:
        return encode_chat(state, messages, add_generation_prompt, plan), ()
    vision = _vision(state, parts)
    policy = policy_of(state)
    encoded = []
    for p in parts:
        data = load_media(p.url, p.param, policy)
        try:
            encoded.append(vision.encode(data))
        except ImageDecodeError as exc:
            raise APIError(400, f"{p.param}: {exc}", p.param) from None
    ids = encode_chat(state, messages, add_generation_prompt, plan, images=True)
    try:
        ids, starts = expand_images(ids, [e.grid for e in encoded], vision.ids)
    except ValueError as exc:
        raise APIError(400, f"messages: {exc}", "messages") from None
    images = tuple(PromptImage(s, e.grid, e.key, e.features)
                   for s, e in zip(starts, encoded, strict=True))
    return ids, images
