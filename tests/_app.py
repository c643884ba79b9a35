"""The real HTTP app of the tree under test on CPU, for the request tests: a real TokenizerManager for the Kimi-K2.5
text model (vocabulary 163840, hidden 7168) with a small word-level tokenizer, behind the FastAPI app of
entrypoints/http_server.py with the real OpenAI serving classes. Only the scheduler (GPU) is stood in: it records
what it is sent and finishes each request with no output tokens."""

import json
from pathlib import Path

import pytest

from _sgl import FIXTURES, KIMI_K25, platform, server_args

VOCAB = 163840
OOV = 999999


def _model_dir(d: Path) -> Path:
    text = json.loads((KIMI_K25 / "config.json").read_text())["text_config"]
    (d / "config.json").write_text(json.dumps({**text, "model_type": "deepseek_v3"}))
    for f in (FIXTURES / "bench" / "tokenizer").iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    return d


class Server:
    """A real TokenizerManager and the real HTTP app in front of it; `sent` is what reached the scheduler."""

    def __init__(self, embedding: bool, model_dir: Path):
        from sglang.srt.entrypoints.engine import init_tokenizer_manager
        from sglang.srt.runtime_context import publish
        from sglang.srt.server_args import PortArgs

        self.args = server_args(12, tp=8, spec=False, model_path=str(_model_dir(model_dir)), is_embedding=embedding)
        with platform(12):
            publish(self.args, role="tokenizer")
            self.tm, self.templates = init_tokenizer_manager(self.args, PortArgs.init_new(self.args))
        self.tm.max_req_input_len = 100_000
        self.tm._dispatch_to_scheduler = self._scheduler
        self.sent = []

    def _scheduler(self, msg):  # the stand-in: record, then finish each request as the detokenizer would
        for req in getattr(msg, "batch", [msg]):
            if not hasattr(req, "input_ids"):
                continue  # an abort
            self.sent.append(req)
            meta = {
                "id": req.rid,
                "finish_reason": {"type": "length", "length": 0},
                "cached_tokens": 0,
                "prompt_tokens": len(req.input_ids),
                "completion_tokens": 0,
                "weight_version": "default",
            }
            if getattr(req, "return_logprob", False):  # no output token: no logprob either
                meta.update(
                    output_token_logprobs=[], output_top_logprobs=[], input_token_logprobs=[], input_top_logprobs=[]
                )
            out = (
                {"embedding": [0.0], "meta_info": meta}
                if hasattr(req, "dimensions")
                else {"text": "", "output_ids": [], "meta_info": meta}
            )
            state = self.tm.rid_to_state[req.rid]
            state.out_list.append(out)
            state.finished = True
            state.event.set()

    def install(self, monkeypatch):
        """Publish this server's arguments and put its tokenizer manager behind the real HTTP app."""
        from sglang.srt.entrypoints import http_server as hs
        from sglang.srt.entrypoints.openai.serving_chat import OpenAIServingChat
        from sglang.srt.entrypoints.openai.serving_completions import OpenAIServingCompletion
        from sglang.srt.entrypoints.openai.serving_embedding import OpenAIServingEmbedding
        from sglang.srt.runtime_context import publish

        publish(self.args, role="tokenizer")
        monkeypatch.setattr(
            hs,
            "_global_state",
            hs._GlobalState(tokenizer_manager=self.tm, template_manager=self.templates, scheduler_info={}),
        )
        for name, cls in (
            ("completion", OpenAIServingCompletion),
            ("chat", OpenAIServingChat),
            ("embedding", OpenAIServingEmbedding),
        ):
            monkeypatch.setattr(hs.app.state, f"openai_serving_{name}", cls(self.tm, self.templates), raising=False)
        self.sent.clear()
        return self

    def client(self):
        from fastapi.testclient import TestClient
        from sglang.srt.entrypoints import http_server as hs

        return TestClient(hs.app)  # not entered: no lifespan, so no warm-up request and no gRPC server


_SERVERS: dict[bool, Server] = {}


def _server(embedding: bool, tmp_path_factory, monkeypatch) -> Server:
    if embedding not in _SERVERS:
        _SERVERS[embedding] = Server(embedding, tmp_path_factory.mktemp("model"))
    return _SERVERS[embedding].install(monkeypatch)


@pytest.fixture
def server(sglang_tree, tmp_path_factory, monkeypatch):
    return _server(False, tmp_path_factory, monkeypatch)


@pytest.fixture
def embedding_server(sglang_tree, tmp_path_factory, monkeypatch):
    return _server(True, tmp_path_factory, monkeypatch)
