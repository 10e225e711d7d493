"""Expanding a prompt's media markers into placeholder tokens, as the Omni processor does:
`<image>` -> `<img>` + `<image>` x (tokens of that image) + `</img>`, and `<so_embedding>` (or
`<audio>`) -> `<so_start>` + `<so_embedding>` x (tokens of that clip) + `<so_end>`."""

from __future__ import annotations

from mobius_lite.errors import MobiusError

IMAGE, IMAGE_START, IMAGE_END = "<image>", "<img>", "</img>"
AUDIO, AUDIO_START, AUDIO_END = "<so_embedding>", "<so_start>", "<so_end>"
AUDIO_MARKERS = (AUDIO, "<audio>")


def expand(text: str, image_tokens: list[int], audio_tokens: list[int]) -> str:
    """Replace the i-th image / audio marker by its expansion; markers and media must pair up
    (a missing marker is appended at the start, as processors put media before the text)."""
    for marker in AUDIO_MARKERS[1:]:
        text = text.replace(marker, AUDIO)
    missing_images = len(image_tokens) - text.count(IMAGE)
    missing_audio = len(audio_tokens) - text.count(AUDIO)
    if missing_images < 0 or missing_audio < 0:
        raise MobiusError(
            f"the prompt has {text.count(IMAGE)} {IMAGE} and {text.count(AUDIO)} {AUDIO} markers "
            f"for {len(image_tokens)} images and {len(audio_tokens)} audio clips"
        )
    text = IMAGE * missing_images + AUDIO * missing_audio + text
    pieces = []
    images, audio = iter(image_tokens), iter(audio_tokens)
    for part in _split(text, (IMAGE, AUDIO)):
        if part == IMAGE:
            pieces.append(IMAGE_START + IMAGE * next(images) + IMAGE_END)
        elif part == AUDIO:
            pieces.append(AUDIO_START + AUDIO * next(audio) + AUDIO_END)
        else:
            pieces.append(part)
    return "".join(pieces)


def _split(text: str, markers: tuple[str, ...]) -> list[str]:
    out, i = [], 0
    while i < len(text):
        hits = [(text.find(m, i), m) for m in markers if text.find(m, i) >= 0]
        if not hits:
            out.append(text[i:])
            break
        at, marker = min(hits)
        if at > i:
            out.append(text[i:at])
        out.append(marker)
        i = at + len(marker)
    return out
