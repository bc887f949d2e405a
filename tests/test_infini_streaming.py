"""InfiniStream: parity with one-shot forwards, constant state, long fp16 streams, errors."""

import pytest
import torch

from attnlens.hooked_models.streaming import InfiniStream

from helpers import random_tokens, tiny_model


def infini(segment_len=5, update="linear", pos="rotary", **overrides):
    model = tiny_model("infini", positional_embedding_type=pos,
                       attn_cfg={"segment_len": segment_len, "update": update}, **overrides)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for block in model.blocks:
            block.attn.beta.copy_(torch.randn(block.attn.beta.shape, generator=g))
    return model


def stream_in_chunks(model, tokens, chunks):
    stream, outs, i = InfiniStream(model), [], 0
    for c in chunks:
        outs.append(stream.feed(tokens[:, i:i + c]))
        i += c
    assert i == tokens.shape[1]
    return torch.cat(outs, 1), stream


@pytest.mark.parametrize("update", ["linear", "delta"])
@pytest.mark.parametrize("pos", ["rotary", "none"])
def test_streaming_matches_one_shot_float64(update, pos):
    model = infini(5, update, pos, dtype="float64")
    tokens = random_tokens(model, batch=2, pos=31)
    with torch.no_grad():
        full = model(tokens)
    for chunks in ([31], [1] * 31, [5, 5, 5, 5, 5, 6], [3, 7, 2, 9, 10]):
        out, stream = stream_in_chunks(model, tokens, chunks)
        torch.testing.assert_close(out, full, atol=1e-12, rtol=0)
        assert stream.n_tokens == 31 and stream.states[0].n_segments == 6


def test_streaming_matches_one_shot_float32_and_memory_hook():
    model = infini(4, "delta", dtype="float32")
    tokens = random_tokens(model, batch=1, pos=32)
    with torch.no_grad():
        full, cache = model.run_with_cache(tokens)
    out, stream = stream_in_chunks(model, tokens, [6, 11, 15])
    # float32 is the point (float64 exactness is checked above): chunking regroups sums of
    # <= 32 terms; with logits ~0.5, M ~2 and z ~35 (a sum of 32 positive terms of ~1), float32
    # rounding (6e-8 relative per term) stays below 1e-5 absolute and 1e-5 relative.
    torch.testing.assert_close(out, full, atol=1e-5, rtol=1e-5)
    for layer in range(model.cfg.n_layers):   # memory after the last (complete) segment
        M, z = stream.memory(layer)
        torch.testing.assert_close(M, cache[f"blocks.{layer}.attn.hook_memory"][:, -1],
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(z, cache[f"blocks.{layer}.attn.hook_memory_z"][:, -1],
                                   atol=1e-5, rtol=1e-5)


def test_state_is_constant_and_stream_exceeds_n_ctx():
    model = infini(8, "linear", n_ctx=16)
    stream = InfiniStream(model)
    g = torch.Generator().manual_seed(0)
    sizes = []
    for _ in range(6):
        stream.feed(torch.randint(0, 50, (1, 40), generator=g))
        sizes.append(stream.state_bytes())
    assert stream.n_tokens == 240 > model.cfg.n_ctx
    assert len(set(sizes)) == 1   # 40 = 5 segments: buffers empty after every chunk
    H, d, L = model.cfg.n_heads, model.cfg.d_head, model.cfg.n_layers
    stream.feed(torch.randint(0, 50, (1, 7), generator=g))   # 7 tokens held in the buffer
    memory = L * H * d * (d + 1) * 4
    assert stream.state_bytes() == memory + L * 3 * 7 * H * d * 4


def test_long_fp16_stream_is_finite():
    """100k fp16 tokens: z reaches ~1e5 (beyond fp16's 65504), kept finite in float32."""
    model = tiny_model("infini", d_model=16, d_head=8, n_layers=1, n_ctx=512, dtype="float16",
                       positional_embedding_type="rotary",
                       attn_cfg={"segment_len": 512, "update": "delta"})
    stream = InfiniStream(model)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        logits = stream.feed(torch.randint(0, 50, (1, 20_000), generator=g))
        assert logits.dtype == torch.float16 and torch.isfinite(logits).all()
    M, z = stream.memory(0)
    assert stream.n_tokens == 100_000 and M.dtype == z.dtype == torch.float32
    assert torch.isfinite(M).all() and torch.isfinite(z).all()
    assert z.max() > torch.finfo(torch.float16).max


def test_generate_matches_uncached_model_generate():
    model = infini(4, "delta")
    prompt = random_tokens(model, batch=1, pos=6)
    expect = model.generate(prompt, max_new_tokens=8, use_cache=False, do_sample=False)
    stream = InfiniStream(model)
    new = stream.generate(8, prompt=prompt)
    torch.testing.assert_close(torch.cat([prompt, new], 1), expect)
    more = stream.generate(2)
    assert more.shape == (1, 2) and stream.n_tokens == 6 + 8 + 2


def test_gradients_flow_across_chunks_until_detached():
    """Gate = 1, so segment 1's outputs see segment 0 only through the carried memory."""
    model = infini(4, "linear", n_layers=1, attn_only=True)
    with torch.no_grad():
        model.blocks[0].attn.beta.fill_(40.0)
    tokens = random_tokens(model, batch=1, pos=8)
    attn = model.blocks[0].attn
    for detach in (False, True):
        model.zero_grad()
        stream = InfiniStream(model, grad=True)
        stream.feed(tokens[:, :4])           # completes segment 0: the memory holds its graph
        if detach:
            stream.detach()
        stream.feed(tokens[:, 4:]).pow(2).sum().backward()
        through_memory = attn.W_K.grad.abs().sum() + attn.W_V.grad.abs().sum()
        assert (through_memory == 0) if detach else (through_memory > 0)
        assert attn.W_Q.grad.abs().sum() > 0
    assert not InfiniStream(model).feed(tokens).requires_grad   # grad=False keeps no graph


def test_bad_models_and_inputs():
    with pytest.raises(ValueError, match="infini"):
        InfiniStream(tiny_model("mha", positional_embedding_type="rotary"))
    with pytest.raises(ValueError, match="standard"):
        InfiniStream(tiny_model("infini", positional_embedding_type="standard"))
    with pytest.raises(ValueError, match="n_ctx"):
        InfiniStream(tiny_model("infini", positional_embedding_type="rotary", n_ctx=8,
                                attn_cfg={"segment_len": 16}))
    stream = InfiniStream(infini(4))
    with pytest.raises(ValueError, match="vocabulary"):
        stream.feed(torch.tensor([[0, 99]]))
    with pytest.raises(ValueError, match="nothing has been fed"):
        stream.memory(0)
    stream.feed(torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="batch size"):
        stream.feed(torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="prompt"):
        InfiniStream(infini(4)).generate(2)


# -- attention-stage hooks on a stream -------------------------------------------------------

def _knockouts(model):
    zero = lambda x, hook: torch.zeros_like(x)            # noqa: E731
    scale = lambda x, hook: 0.5 * x                        # noqa: E731
    return {"a_mem zeroed": [(f"blocks.{i}.attn.hook_a_mem", zero)
                             for i in range(model.cfg.n_layers)],
            "gate zeroed": [("blocks.0.attn.hook_gate", zero)],
            "a_dot halved": [("blocks.1.attn.hook_a_dot", scale)]}


@pytest.mark.parametrize("update", ["linear", "delta"])
def test_stage_edits_on_a_stream_equal_the_one_shot_edits_float64(update):
    """The memory knock-out (and any a_dot / a_mem / gate edit) acts on a stream exactly as in
    one forward, in any chunking; each edit changes the output (it is not ignored)."""
    model = infini(5, update, dtype="float64")
    tokens = random_tokens(model, batch=2, pos=31)
    with torch.no_grad():
        plain = model(tokens)
    for name, hooks in _knockouts(model).items():
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            full = model(tokens)
        assert (full - plain).abs().max() > 1e-3, name
        for chunks in ([31], [1] * 31, [3, 7, 2, 9, 10]):
            with model.hooks(fwd_hooks=hooks):
                out, _ = stream_in_chunks(model, tokens, chunks)
            torch.testing.assert_close(out, full, atol=1e-12, rtol=0, msg=f"{name} {chunks}")


def test_stream_stage_hooks_see_the_one_shot_values_per_piece():
    model = infini(4, "delta", dtype="float64")
    tokens = random_tokens(model, batch=1, pos=14)
    _, cache = model.run_with_cache(tokens)
    seen = {"a_mem": [], "a_dot": [], "gate": []}

    def keep(x, hook):
        seen[hook.name.split("_", 1)[1]].append(x.clone())

    hooks = [(f"blocks.0.attn.hook_{s}", keep) for s in seen]
    with model.hooks(fwd_hooks=hooks):
        stream_in_chunks(model, tokens, [6, 8])       # pieces 4+2, 2+4+2: 5 pieces
    assert [x.shape[1] for x in seen["a_mem"]] == [4, 2, 2, 4, 2]
    for stage in ("a_mem", "a_dot"):
        torch.testing.assert_close(torch.cat(seen[stage], 1), cache[f"blocks.0.attn.hook_{stage}"],
                                   atol=1e-12, rtol=0)
    assert all(torch.equal(g, cache["blocks.0.attn.hook_gate"]) for g in seen["gate"])


def test_whole_context_stage_hooks_refuse_to_stream():
    from attnlens.hooked_models.attention.infini.layer import STREAM_STAGES, WHOLE_CONTEXT_STAGES

    model = infini(4)
    names = {s.name for s in model.stages(0)}
    assert names == set(STREAM_STAGES) | set(WHOLE_CONTEXT_STAGES)   # every stage has a rule
    tokens = random_tokens(model, batch=1, pos=8)
    for stage in WHOLE_CONTEXT_STAGES:
        with model.hooks(fwd_hooks=[(f"blocks.1.attn.hook_{stage}", lambda x, hook: None)]):
            with pytest.raises(ValueError, match=f"layer 1: hooks on \\['{stage}'\\] cannot "
                                                 "run while streaming"):
                InfiniStream(model).feed(tokens)
    InfiniStream(model).feed(tokens)                  # the hooks are gone: streams again
