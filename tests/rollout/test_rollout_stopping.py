"""Stop token ids, eos, stop strings and finish reasons, checked against an unstopped greedy run."""

from __future__ import annotations

from rollout_kit import prompts, requests, tiny_model

from ringzero.rollout.engine.embedded import EmbeddedEngine
from ringzero.tokenizer import CharTokenizer

TOK = CharTokenizer()


def _greedy(engine, prompt, **params):
    return engine.generate(requests([prompt], max_new_tokens=24, temperature=0, **params))[0][0]


def _free_run(model, prompt):
    """Greedy output with no stop at all (no tokenizer, so not even eos)."""
    return _greedy(EmbeddedEngine(model), prompt)


def test_stop_token_id_ends_the_row_and_stays_in_the_output():
    model = tiny_model("float64")
    prompt = prompts([6])[0]
    free = _free_run(model, prompt)
    stop_id = free.output_ids[5]
    first = free.output_ids.index(stop_id)
    c = _greedy(EmbeddedEngine(model), prompt, stop_token_ids=(stop_id, 63 if stop_id != 63 else 62))
    assert c.output_ids == free.output_ids[: first + 1]
    assert c.output_logprobs == free.output_logprobs[: first + 1]
    assert c.finish_reason == "stop" and c.matched_stop == stop_id


def test_eos_of_the_tokenizer_always_stops():
    model = tiny_model("float64")
    prompt = prompts([7])[0]
    free = _free_run(model, prompt)
    tok = CharTokenizer()
    tok.eos_id = free.output_ids[4]  # an eos the greedy path is known to emit
    c = _greedy(EmbeddedEngine(model, tok), prompt)
    assert c.output_ids == free.output_ids[: free.output_ids.index(tok.eos_id) + 1]
    assert c.finish_reason == "stop" and c.matched_stop == tok.eos_id


def test_stop_string_matches_the_decoded_output():
    model = tiny_model("float64")
    prompt = prompts([5], seed=3)[0]
    free = _free_run(model, prompt)
    text = TOK.decode(free.output_ids)
    stop = text[6:8]
    assert len(stop) == 2, f"the greedy output decodes to too little text: {text!r}"
    cut = next(i for i in range(1, len(free.output_ids) + 1) if stop in TOK.decode(free.output_ids[:i]))
    c = _greedy(EmbeddedEngine(model, TOK), prompt, stop=("zz-never", stop))
    if TOK.eos_id in free.output_ids[:cut]:
        cut = free.output_ids.index(TOK.eos_id) + 1
        assert c.matched_stop == TOK.eos_id
    else:
        assert c.matched_stop == stop and TOK.decode(c.output_ids).endswith(stop)
    assert c.output_ids == free.output_ids[:cut] and c.finish_reason == "stop"


def test_mixed_finish_reasons_in_one_batch():
    model = tiny_model("float64")
    batch = prompts([4, 6, 8, 5, 7], seed=4)
    frees = [_free_run(model, p) for p in batch]
    stop_id = frees[0].output_ids[2]
    outs = EmbeddedEngine(model, max_batch=8).generate(
        requests(batch, max_new_tokens=24, temperature=0, stop_token_ids=(stop_id,))
    )
    reasons = set()
    for free, (c,) in zip(frees, outs, strict=True):
        if stop_id in free.output_ids:
            assert c.output_ids == free.output_ids[: free.output_ids.index(stop_id) + 1]
            assert (c.finish_reason, c.matched_stop) == ("stop", stop_id)
        else:
            assert c.output_ids == free.output_ids
            assert (c.finish_reason, c.matched_stop) == ("length", None)
        reasons.add(c.finish_reason)
    assert reasons == {"stop", "length"}
