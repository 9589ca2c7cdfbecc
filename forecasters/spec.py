"""The record types of the forecaster registry: what a prompt is built from (`PromptInput`) and one phrase source
(`ForecasterSpec`). Their own module, so the modules defining forecasters (`forecasters.registry`'s built-ins,
`forecasters.probes`) import them without importing each other; `forecasters.registry` assembles the registry."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from forecasters.parsing import ParsedPhrase, parse_phrase
from forecasters.presets import DEFAULT_MAX_PIXELS


@dataclass(frozen=True)
class PromptInput:
    """Inputs of one prompt: ``values`` for text placeholders; ``media`` maps a media placeholder to image paths."""

    values: dict[str, str]
    media: dict[str, tuple[str, ...]] = field(default_factory=dict)


@dataclass(frozen=True)
class ForecasterSpec:
    """One phrase source. ``prompt`` is a template id of `prompts` (or a path to a template file); ``default_model``
    a preset name or model id; ``max_tokens`` its default generation budget (the paper's baselines: 24);
    ``max_pixels`` the cap its frames are resized to before sending (`forecasters.presets`, pixel policy);
    ``kind``: ``generate`` (a phrase is generated and parsed) or ``likelihood`` (candidate answers are scored,
    `forecasters.likelihood`; ``parse`` and ``max_tokens`` are not used); ``media``: the media placeholders
    ``build`` fills (``()`` for a text-only prompt), sent as ``media_as``."""

    name: str
    prompt: str
    build: Callable[[Any, Any], PromptInput]
    default_model: str
    parse: Callable[[str], ParsedPhrase] = parse_phrase
    media_as: Literal["images", "video"] = "images"
    max_tokens: int = 24
    max_pixels: int | None = DEFAULT_MAX_PIXELS
    system: str | None = None
    description: str = ""
    kind: Literal["generate", "likelihood"] = "generate"
    media: tuple[str, ...] = ("frames",)

    @property
    def media_kind(self) -> str:
        """What the prompt carries besides text: ``none``, ``images`` or ``video``."""
        return self.media_as if self.media else "none"

    def inputs(self, query, bench) -> PromptInput:
        """``build(query, bench)``, checked to fill only the declared ``media`` placeholders."""
        inp = self.build(query, bench)
        extra = sorted(set(inp.media) - set(self.media))
        if extra:
            raise ValueError(f"forecaster {self.name!r}: build filled media placeholder(s) {extra}, not declared in "
                             f"its media {self.media}")
        return inp
