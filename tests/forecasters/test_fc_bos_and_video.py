"""What every backend sends around a chat: the BOS where the template lacks it (`missing_bos`; the openai backend asks
the server, `OpenAIBackend.adds_bos`), and a video's frame rate (`frame_rate`, `video_metadata`). The engines
themselves are compared in `test_fc_architectures.py` (LLaVA-NeXT's prompts, Qwen-VL video through vLLM)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from eval.errors import InputError
from eval.frames import FrameSelection
from forecasters.backends import Request, SamplingParams, VideoPart
from forecasters.backends.base import RetryPolicy, ServerUnavailable, missing_bos, video_metadata
from forecasters.backends.openai_compat import OpenAIBackend, OpenAIConfig, video_data_url
from forecasters.prompting import DEFAULT_FPS, frame_rate
from forecasters.tiny_models import build_llama_tokenizer, build_tokenizer, chat_template

CHAT = [{"role": "user", "content": "What will the red ball do next?"}]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("tok")
    llava = chat_template("llava_next", "native")
    return {"llava": build_llama_tokenizer(root / "llava", template=llava),
            # the same tokenizer with a template that writes the BOS itself (as Llama 3's does)
            "writes_bos": build_llama_tokenizer(root / "bos", template="{{ bos_token }}" + llava),
            "qwen": build_tokenizer(root / "qwen")}


def _rendered(tok) -> str:
    return tok.apply_chat_template(CHAT, add_generation_prompt=True, tokenize=False)


def test_the_bos_is_added_exactly_where_the_template_lacks_it(tokenizers):
    llava, writes, qwen = tokenizers["llava"], tokenizers["writes_bos"], tokenizers["qwen"]
    assert not _rendered(llava).startswith("<s>") and missing_bos(llava, _rendered(llava))
    assert _rendered(writes).startswith("<s>") and not missing_bos(writes, _rendered(writes))
    assert qwen.bos_token is None and not missing_bos(qwen, _rendered(qwen))
    # tokenized by that rule, each prompt starts with exactly one BOS (Qwen: none)
    for name, tok in tokenizers.items():
        ids = tok.encode(_rendered(tok), add_special_tokens=missing_bos(tok, _rendered(tok)))
        if name == "qwen":
            assert tok.bos_token_id is None or tok.bos_token_id not in ids
        else:
            assert ids[0] == tok.bos_token_id and ids[1] != tok.bos_token_id, (name, ids[:3])


def _query(n: int = 8, start: float = 2.0, end: float = 5.5):
    return SimpleNamespace(prefix_frames=tuple(f"v/{i}.png" for i in range(n)), prefix_start=start, prefix_end=end)


def test_a_videos_frame_rate_comes_from_the_prefix_times_of_the_frames_it_keeps():
    q = _query()  # 8 frames over 3.5 s: one every 0.5 s
    assert frame_rate(q, q.prefix_frames, FrameSelection()) == pytest.approx(2.0)
    assert frame_rate(q, q.prefix_frames, FrameSelection("last", 4)) == pytest.approx(2.0)
    # spaced:3 keeps frames 0, 4, 7 (round(3.5) = 4): 2 intervals over the whole 3.5 s
    assert frame_rate(q, q.prefix_frames, FrameSelection("spaced", 3)) == pytest.approx(2 / 3.5)
    # no time to measure, or frames that are not the prefix: the default
    assert frame_rate(q, q.prefix_frames, FrameSelection("last", 1)) == DEFAULT_FPS
    assert frame_rate(q, ("other/0.png", "other/1.png"), FrameSelection()) == DEFAULT_FPS
    assert frame_rate(_query(end=2.0), _query(end=2.0).prefix_frames, FrameSelection()) == DEFAULT_FPS


def test_video_metadata_says_every_frame_was_sampled_at_the_videos_rate():
    from PIL import Image

    from forecasters.backends import ImagePart

    frames = tuple(ImagePart(Image.new("RGB", (8, 8))) for _ in range(6))
    meta = video_metadata(VideoPart(frames, fps=2.0))
    assert meta == {"total_num_frames": 6, "fps": 2.0, "duration": 3.0, "frames_indices": [0, 1, 2, 3, 4, 5]}
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(InputError, match="frame rate"):
            VideoPart(frames, fps=bad)


def _server(mode: str):
    """A stand-in of vLLM's ``/tokenize`` (``mode``: ``adds`` -- the tokenizer adds a BOS the chat template does not
    write, ``writes`` -- the template writes it, ``absent`` -- no such endpoint, ``down`` -- 503 on it) with
    ``/v1/models``; it records every path asked."""
    from json_standin import JSONStandIn

    def answer(method, path, body):
        if method == "GET":
            return 200, {"data": [{"id": "m"}]}
        if mode == "absent":
            return 404, {"detail": "Not Found"}
        if mode == "down":
            return 503, {"error": {"message": "overloaded"}}
        if "messages" in body:  # the rendered chat, without special tokens
            return 200, {"tokens": [1, 7, 8] if mode == "writes" else [7, 8]}
        return 200, {"tokens": [1, 9] if body["add_special_tokens"] else [9]}

    return JSONStandIn(answer)


@pytest.mark.parametrize("mode, adds", [("adds", True), ("writes", False), ("absent", False)])
def test_the_openai_backend_asks_the_server_once_whether_chats_need_the_bos(mode, adds):
    with _server(mode) as server:
        b = OpenAIBackend(OpenAIConfig(model="m", base_url=server.base_url, retry=RetryPolicy(max_attempts=1)))
        b.preflight()
        request = Request("q1", ("Q?",), SamplingParams(max_tokens=4))
        assert ("add_special_tokens" in b.payload(request)) is adds
        assert ("add_special_tokens" in b.score_payload(request, "rolling")) is adds
        b.payload(request)
        assert server.paths.count("/tokenize") == (1 if mode == "absent" else 3)  # asked once, before any request
        b.close()


def test_a_set_switch_is_not_asked_and_a_server_that_fails_the_question_is_unavailable():
    with _server("down") as server:
        cfg = dict(model="m", base_url=server.base_url, retry=RetryPolicy(max_attempts=2, wait_initial=0.01,
                                                                          wait_max=0.02))
        b = OpenAIBackend(OpenAIConfig(**cfg, add_special_tokens=True))
        b.preflight()
        assert b.payload(Request("q1", ("Q?",)))["add_special_tokens"] is True
        assert "/tokenize" not in server.paths
        b.close()
        b = OpenAIBackend(OpenAIConfig(**cfg))
        with pytest.raises(ServerUnavailable, match="did not tokenize a chat"):
            b.preflight()
        assert server.paths.count("/tokenize") == 2  # retried under the policy, then refused
        b.close()


def test_a_video_goes_over_http_as_its_frames_with_its_frame_rate():
    import base64
    import io

    from PIL import Image

    from forecasters.backends import ImagePart

    colours = [(255, 0, 0), (0, 255, 0), (0, 0, 255)]
    video = VideoPart(tuple(ImagePart(Image.new("RGB", (8, 6), c)) for c in colours), fps=2.5)
    b = OpenAIBackend(OpenAIConfig(model="m", base_url="http://127.0.0.1:9/v1"))  # a body is built offline
    body = b.payload(Request("q1", (video, "Where does the cup end up?"), SamplingParams(max_tokens=4)))
    assert body["media_io_kwargs"] == {"video": {"fps": 2.5}}
    (msg,) = body["messages"]
    part, text = msg["content"]
    assert text == {"type": "text", "text": "Where does the cup end up?"} and part["type"] == "video_url"
    url = part["video_url"]["url"]
    assert url == video_data_url(video) and url.startswith("data:video/jpeg;base64,")
    frames = [Image.open(io.BytesIO(base64.b64decode(x))) for x in url.split(",", 1)[1].split(",")]
    assert [f.convert("RGB").getpixel((0, 0)) for f in frames] == colours  # lossless, in order
    score = b.score_payload(Request("q1", (video, "Q?")), "rolling")
    assert score["media_io_kwargs"] == {"video": {"fps": 2.5}}
    assert "media_io_kwargs" not in b.payload(Request("q2", ("Q?",)))
    b.close()
