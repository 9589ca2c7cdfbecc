"""A forecaster's prompt for one query, rendered into a backend `Request`: the spec's inputs (`ForecasterSpec.inputs`)
fill the template's text placeholders, and each media placeholder becomes the selected frames (`FrameSelection`)
from the frame cache, as separate images or as one video (``ForecasterSpec.media_as``).

The runner, the likelihood forecaster, the tiny-model fit and the SFT set builder (`distill`) render prompts here,
so a student is trained on the very requests it is served."""

from __future__ import annotations

import prompts
from forecasters.backends.base import Request, SamplingParams, VideoPart
from forecasters.media import FrameCache, FrameSelection
from forecasters.spec import ForecasterSpec

#: The frame rate of a video whose frames' times are unknown (frames that are not the query's prefix).
DEFAULT_FPS = 1.0


def frame_rate(query, paths, selection: FrameSelection) -> float:
    """Frames per second of the frames ``selection`` keeps of ``paths`` when ``paths`` are the query's prefix frames
    (taken evenly from ``prefix_start`` to ``prefix_end``, as the benchmark's prefixes are): the kept frames' number
    minus one over the time between the first and the last kept; `DEFAULT_FPS` otherwise (other frames, one frame,
    no time between them)."""
    prefix = tuple(getattr(query, "prefix_frames", ()) or ())
    n = len(prefix)
    if n < 2 or tuple(paths) != prefix:
        return DEFAULT_FPS
    kept = selection.apply(range(n))
    span = (float(query.prefix_end) - float(query.prefix_start)) * (kept[-1] - kept[0]) / (n - 1)
    return (len(kept) - 1) / span if len(kept) > 1 and span > 0 else DEFAULT_FPS


def render_request(spec: ForecasterSpec, template: prompts.Template, query, bench, frames: FrameCache, *,
                   sampling: SamplingParams, n_frames: int | None = None,
                   selection: FrameSelection | None = None) -> Request:
    """Render a forecaster's prompt for one query into a backend `Request` (media from the frame cache).

    ``selection`` picks the frames of each media slot (`FrameSelection`: all, last, K last, spaced:K);
    ``n_frames=K`` is shorthand for ``selection=spaced:K`` (K evenly spaced, the last kept)."""
    if selection is None:
        selection = FrameSelection("spaced", n_frames) if n_frames else FrameSelection()
    inp = spec.inputs(query, bench)
    parts = []
    for part in template.render_parts(inp.values, media=tuple(inp.media)):
        if isinstance(part, str):
            parts.append(part)
            continue
        imgs = frames.get_many(selection.apply(inp.media[part.name]))
        if spec.media_as == "video":
            parts.append(VideoPart(tuple(imgs), fps=frame_rate(query, inp.media[part.name], selection)))
        else:
            parts.extend(imgs)
    return Request(id=query.id, parts=tuple(parts), sampling=sampling, system=spec.system)
