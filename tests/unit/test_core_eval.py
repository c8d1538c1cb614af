"""eval.py --task core and pilegpt/core_eval.py in this process, on a bundle the test writes in DCLM's own format
(core.yaml, eval_meta_data.csv, eval_data/*.jsonl): each task type's prompt character for character, nanochat's row
order and few-shot draw, the choice a bigram model with set logits makes against a hand computation, centered
accuracy and CORE by the formula, a split over two processes equal to one, and every refusal in one line."""

import json
import math
import random
import zipfile

import pytest
import torch
from torch import nn

import eval as eval_script
from helpers import CORE_BUNDLE, CORE_LM, CORE_MC, CORE_SCHEMA, Server, main_error, write_core_bundle
from pilegpt import core_eval
from pilegpt.common import UserError
from pilegpt.tokenizer import EOT_ID, GPT2_VOCAB_SIZE, gpt2

S = 6.0  # the bigram's logit for its preferred next token (every other token: 0)
L_HIT = math.log(math.exp(S) + GPT2_VOCAB_SIZE - 1) - S  # the loss of the preferred token
L_MISS = math.log(math.exp(S) + GPT2_VOCAB_SIZE - 1)  # the loss of any other


class Bigram(nn.Module):
    """logits[t] = S at next_of[idx[t]] (where idx[t] has one), 0 elsewhere: every loss is L_HIT or L_MISS."""

    def __init__(self, next_of: dict[int, int], block_size: int = 64):
        super().__init__()
        self.next_of, self.block_size = next_of, block_size

    def forward(self, idx, targets=None):
        logits = torch.zeros(*idx.shape, GPT2_VOCAB_SIZE)
        for a, b in self.next_of.items():
            logits[..., b] += S * (idx == a)
        return logits, None


def tok(text: str) -> list[int]:
    return gpt2().encode_ordinary(text)


def test_each_type_renders_its_prompts_character_for_character():
    mc = core_eval.render("multiple_choice", {"query": "Q: sky?", "choices": ["blue", "red"], "gold": 0},
                          [{"query": "Q: grass?", "choices": ["green", "pink"], "gold": 0},
                           {"query": "Q: snow?", "choices": ["black", "white"], "gold": 1}], "\nA: ")
    assert mc == ["Q: grass?\nA: green\n\nQ: snow?\nA: white\n\nQ: sky?\nA: blue",
                  "Q: grass?\nA: green\n\nQ: snow?\nA: white\n\nQ: sky?\nA: red"]
    schema = core_eval.render("schema", {"context_options": ["Ann fed the dog", "Ann fed the cat"],
                                         "continuation": "it purred", "gold": 1},
                              [{"context_options": ["Bo ran", "Bo sat"], "continuation": "fast", "gold": 0}], " ")
    assert schema == ["Bo ran fast\n\nAnn fed the dog it purred", "Bo ran fast\n\nAnn fed the cat it purred"]
    lm = core_eval.render("language_modeling", {"context": "  one two three \n", "continuation": "four"},
                          [{"context": "a b ", "continuation": "c"}], " ")
    assert lm == ["a b c\n\none two three", "a b c\n\none two three four"]  # contexts trimmed; without: stripped


def test_rows_are_shuffled_with_1337_and_few_shot_drawn_with_1234_plus_i():
    rows = [{"n": i} for i in range(20)]
    want = list(rows)
    random.Random(1337).shuffle(want)
    kept = core_eval.select(rows, 7)
    assert kept == want[:7] and rows == [{"n": i} for i in range(20)]  # the input untouched
    for i in range(7):
        others = [j for j in range(7) if j != i]
        assert core_eval.fewshot(kept, i, 3) == [kept[j] for j in random.Random(1234 + i).sample(others, 3)]
        assert kept[i] not in core_eval.fewshot(kept, i, 6)
    assert core_eval.fewshot(kept, 0, 0) == []


def test_scored_spans_and_a_prompt_longer_than_the_context():
    enc = gpt2()
    rows, cut = core_eval.token_rows("multiple_choice", ["Q: sky is blue", "Q: sky is red wine"], enc, 64)
    prefix = [EOT_ID] + tok("Q: sky is")
    assert not cut and [r.tokens for r in rows] == [prefix + tok(" blue"), prefix + tok(" red wine")]
    assert [(r.start, r.end) for r in rows] == [(len(prefix), len(prefix) + 1), (len(prefix), len(prefix) + 2)]
    rows, _ = core_eval.token_rows("schema", ["Ann fed the dog because", "Ann fed a cat because"], enc, 64)
    assert [(r.start, r.end) for r in rows] == [(len(r.tokens) - 1, len(r.tokens)) for r in rows]
    rows, _ = core_eval.token_rows("language_modeling", ["one two", "one two three four"], enc, 64)
    assert rows == [core_eval.Row([EOT_ID] + tok("one two three four"), 3, 5)]
    long = "word " * 40 + "end"
    rows, cut = core_eval.token_rows("language_modeling", [long.rsplit(" ", 1)[0], long], enc, 16)
    assert cut and rows[0].tokens == ([EOT_ID] + tok(long))[-16:] and (rows[0].start, rows[0].end) == (15, 16)


def test_a_choice_that_is_a_token_prefix_of_another_is_scored_on_its_last_token_and_can_win():
    """"blue" is all of "blue sky"'s first tokens: scored after the prefix they share, its row held no token (a mean
    loss of inf, never picked, in silence). Every row now starts at the shortest one's last token."""
    enc, cpu = gpt2(), torch.device("cpu")
    (is_,), (blue,), (sky,) = tok(" is"), tok(" blue"), tok(" sky")
    prompts = core_eval.render("multiple_choice", {"query": "The sky is", "choices": ["blue", "blue sky"], "gold": 0},
                               [], " ")
    rows, _ = core_eval.token_rows("multiple_choice", prompts, enc, 64)
    prefix = [EOT_ID] + tok("The sky is")
    assert [r.tokens for r in rows] == [prefix + [blue], prefix + [blue, sky]]
    assert [(r.start, r.end) for r in rows] == [(len(prefix), len(prefix) + 1), (len(prefix), len(prefix) + 2)]
    item = core_eval.Item(0, 0, "multiple_choice", 0, rows, False)
    scores = core_eval.row_scores(Bigram({is_: blue}), rows, cpu)  # " is" -> " blue": blue's L_HIT beats the mean
    uniform = math.log(GPT2_VOCAB_SIZE)  # " blue" -> " sky": every logit 0 after " blue"
    assert [m for m, _ in scores] == pytest.approx([L_HIT, (L_HIT + uniform) / 2], abs=1e-4)
    assert core_eval.judge(item, scores).pred == 0
    scores = core_eval.row_scores(Bigram({blue: sky}), rows, cpu)  # " blue" -> " sky" alone: blue sky's mean wins
    assert [m for m, _ in scores] == pytest.approx([uniform, (uniform + L_HIT) / 2], abs=1e-4)
    assert core_eval.judge(item, scores).pred == 1


def test_each_type_picks_as_a_hand_computation_of_its_losses_says(tmp_path):
    sky, green, (red, wine) = tok(" is")[0], tok(" green")[0], tok(" red wine")
    # " is" -> " green" (green wins); " red" -> " wine": red wine's mean (L_MISS + L_HIT) / 2 beats blue's L_MISS
    model = Bigram({sky: green, red: wine})
    enc, cpu = gpt2(), torch.device("cpu")
    item = core_eval.Item(0, 0, "multiple_choice", 0, core_eval.token_rows(
        "multiple_choice", core_eval.render("multiple_choice", CORE_MC[0], [], " "), enc, 64)[0], False)
    scores = core_eval.row_scores(model, item.rows, cpu)
    # float32 logits over 50,257 tokens: their log-sum-exp is good to ~2e-5 of the float64 hand computation
    assert [m for m, _ in scores] == pytest.approx([L_MISS, L_HIT, (L_MISS + L_HIT) / 2], abs=1e-4)
    assert core_eval.judge(item, scores) == core_eval.Result(0, 0, False, 1, False)
    model.next_of = {sky: red, red: wine}  # both of red wine's tokens predicted: the lowest mean, 2 * L_HIT / 2
    assert core_eval.judge(item, core_eval.row_scores(model, item.rows, cpu)).pred == 2

    three, four = tok(" three")[0], tok(" four")[0]
    prompts = core_eval.render("language_modeling", CORE_LM[0], [], " ")
    lm = core_eval.token_rows("language_modeling", prompts, enc, 64)[0]
    assert core_eval.row_scores(Bigram({three: four}), lm, cpu)[0] == (pytest.approx(L_HIT, abs=1e-4), True)
    assert core_eval.row_scores(Bigram({three: green}), lm, cpu)[0][1] is False  # greedy must predict all of it


def test_a_bundle_scores_every_type_and_core_is_the_mean_centered_accuracy(tmp_path):
    write_core_bundle(tmp_path, CORE_BUNDLE)
    tasks = core_eval.read_bundle(tmp_path)
    assert [(t.label, t.kind, t.num_fewshot, t.delimiter, t.baseline) for t in tasks] == [
        ("mc", "multiple_choice", 0, " ", 0.2), ("mc_2shot", "multiple_choice", 2, " ", 0.25),
        ("schema", "schema", 1, " ", 0.5), ("lm", "language_modeling", 0, " ", 0.0)]
    kept = [core_eval.select(core_eval.read_rows(t), None) for t in tasks]
    # the bigram: " is" -> " blue", " dog"/" cat" both -> " because" (schema: the gold's context wins only by the
    # loss of "because" after it), " three" -> " four"
    model = Bigram({tok(" is")[0]: tok(" blue")[0], tok(" cat")[0]: tok(" because")[0],
                    tok(" three")[0]: tok(" four")[0]})
    results, passes = core_eval.evaluate(model, core_eval.items(tasks, kept, gpt2(), 64), torch.device("cpu"),
                                         batch_size=5)
    assert [(r.task, r.ind) for r in results] == [(t, i) for t, rows in enumerate(kept) for i in range(len(rows))]
    want = {"mc": [r["gold"] == 0 for r in kept[0]], "mc_2shot": [r["gold"] == 0 for r in kept[1]],
            "schema": [r["gold"] == 1 for r in kept[2]], "lm": [True] * 4}
    summary = core_eval.summarize(tasks, results)
    for t, task in enumerate(tasks):
        acc = sum(want[task.label]) / len(want[task.label])
        got = summary["tasks"][task.label]
        assert [r.correct for r in results if r.task == t] == want[task.label], task.label
        assert (got["n"], got["acc"]) == (len(kept[t]), acc)
        assert got["centered"] == pytest.approx((acc - task.baseline) / (1 - task.baseline))
    assert summary["core"] == pytest.approx(sum(v["centered"] for v in summary["tasks"].values()) / 4)
    # two processes' shares (every second item over all tasks), merged, are the one process's results
    halves = [core_eval.evaluate(model, core_eval.items(tasks, kept, gpt2(), 64, keep=lambda n, r=r: n % 2 == r),
                                 torch.device("cpu"), batch_size=3)[0] for r in (0, 1)]
    assert sorted(halves[0] + halves[1]) == sorted(results)
    rows = sum(len(r.get("choices", r.get("context_options", [0]))) for k in kept for r in k)
    assert rows / 5 <= passes <= rows  # 5 rows a pass, an item's rows never left behind


def test_eval_py_scores_a_bundle_and_writes_per_task_results(tmp_path, model_file, capsys):
    write_core_bundle(tmp_path / "b", CORE_BUNDLE)
    out = tmp_path / "core.json"
    assert eval_script.main([str(model_file), "--task", "core", "--data", str(tmp_path / "b"), "--max-per-task", "4",
                             "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["task"] == "core" and result["n"] == 16 and result["max_per_task"] == 4
    assert {k: v["n"] for k, v in result["tasks"].items()} == {"mc": 4, "mc_2shot": 4, "schema": 4, "lm": 4}
    assert result["core"] == pytest.approx(sum(v["centered"] for v in result["tasks"].values()) / 4)
    assert len(result["predictions"]) == 16 and {p["task"] for p in result["predictions"]} == set(CORE_BUNDLE)
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith(f"core: CORE {result['core']:.4f} over 4 tasks, 16 items, ")


def refusal(tmp_path, change) -> str:
    write_core_bundle(tmp_path / "b", CORE_BUNDLE)
    change(tmp_path / "b")
    with pytest.raises(UserError) as e:
        eval_script.load_core(eval_script.parse_args(["m.pt", "--task", "core", "--data", str(tmp_path / "b"),
                                                     "--max-per-task", "3"]))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_every_refusal_is_one_line_naming_the_file(tmp_path):
    assert "no core.yaml in it" in refusal(tmp_path / "1", lambda b: (b / "core.yaml").unlink())
    gone = refusal(tmp_path / "2", lambda b: (b / "eval_data" / "group" / "lm.jsonl").unlink())
    assert "(lm): its data file" in gone and "lm.jsonl does not exist" in gone
    damaged = refusal(tmp_path / "3", lambda b: (b / "eval_data" / "group" / "schema.jsonl").write_text(
        json.dumps(CORE_SCHEMA[0]) + "\n" + '{"context_options": ["a"], "continuation": "x", "gold": 0}\n'))
    assert damaged.endswith("schema.jsonl:2: context_options must be a list of two or more strings")
    outside = refusal(tmp_path / "4", lambda b: (b / "core.yaml").write_text(
        (b / "core.yaml").read_text().replace("group/lm.jsonl", "../../secret.jsonl")))
    assert "points outside" in outside
    gold = refusal(tmp_path / "5", lambda b: (b / "eval_data" / "group" / "mc.jsonl").write_text(
        json.dumps({**CORE_MC[0], "gold": 3}) + "\n"))
    assert gold.endswith("mc.jsonl:1: gold 3 is not the index of one of its 3 options")
    assert "states no random baseline" in refusal(tmp_path / "6", lambda b: (b / "eval_meta_data.csv").write_text(
        "Eval Task,Random baseline\nmc,25\n"))
    assert "not a percentage" in refusal(tmp_path / "7", lambda b: (b / "eval_meta_data.csv").write_text(
        "Eval Task,Random baseline\nmc,100\nmc_2shot,1\nschema,1\nlm,nan\n"))
    assert "icl_task_type 'generate'" in refusal(tmp_path / "9", lambda b: (b / "core.yaml").write_text(
        (b / "core.yaml").read_text().replace("icl_task_type: schema", "icl_task_type: generate")))


def test_too_few_rows_for_the_few_shot_examples_names_the_fix(tmp_path, model_file, capsys):
    write_core_bundle(tmp_path, CORE_BUNDLE)
    line = main_error(eval_script.main, [model_file, "--task", "core", "--data", tmp_path, "--max-per-task", "2"],
                      capsys)
    assert line == ("error: mc_2shot takes 2 few-shot examples from its other rows, but 2 row(s) are kept: set "
                    "--max-per-task to 3 or more")
    line = main_error(eval_script.main, [model_file, "--task", "core", "--data", tmp_path / "nowhere"], capsys)
    assert "no core.yaml in it" in line


@pytest.mark.parametrize("task, row, why", [
    ("lm", {"context": "Count 9: one two three", "continuation": ""}, "its continuation is empty"),
    ("schema", {"context_options": ["Ann fed the dog", "Ann fed the cat"], "continuation": "", "gold": 1},
     "its continuation is empty"),
    ("mc", {"query": "The sky is", "choices": ["blue", ""], "gold": 1}, "choice 1 is empty"),
    ("mc", {"query": "The sky is", "choices": ["blue", "blue", "blue"], "gold": 2}, "its 3 choices are one text"),
    ("schema", {"context_options": ["Ann fed it", "Ann fed it"], "continuation": "x", "gold": 0},
     "its 2 context_options are one text"),
])
def test_a_row_that_leaves_nothing_to_score_is_refused_naming_its_line(tmp_path, model_file, capsys, task, row, why):
    """An LM row whose continuation is "" was scored on the delimiter alone (" ", counted wrong in silence, CORE
    lowered); each such row is eval.py's one line FILE:LINE, like every other malformed row (train.py's core_data is
    read by the same core_eval.load)."""
    write_core_bundle(tmp_path / "b", CORE_BUNDLE)
    data = tmp_path / "b" / "eval_data" / "group" / f"{task}.jsonl"
    data.write_text(data.read_text() + json.dumps(row) + "\n")
    line_no = len(data.read_text().splitlines())
    line = main_error(eval_script.main, [model_file, "--task", "core", "--data", tmp_path / "b"], capsys)
    assert line == f"error: {data}:{line_no}: {why}, which leaves nothing of the row to score; fix or drop the row"


def test_the_bundle_is_downloaded_once_unpacked_and_a_hostile_zip_is_refused(tmp_path):
    write_core_bundle(tmp_path / "src" / "eval_bundle", CORE_BUNDLE)
    good = tmp_path / "good.zip"
    with zipfile.ZipFile(good, "w") as z:
        for p in sorted((tmp_path / "src").rglob("*")):
            z.write(p, p.relative_to(tmp_path / "src").as_posix())
    server = Server(good.read_bytes(), "eval_bundle.zip")
    try:
        folder = core_eval.download(server.url, tmp_path / "cache")
        assert core_eval.download(server.url, tmp_path / "cache") == folder and server.requests == 1
    finally:
        server.close()
    assert [t.label for t in core_eval.read_bundle(folder)] == list(CORE_BUNDLE)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == ["eval_bundle"]  # the zip and temporaries gone

    bad = tmp_path / "bad.zip"
    with zipfile.ZipFile(bad, "w") as z:
        z.writestr("eval_bundle/core.yaml", (tmp_path / "src" / "eval_bundle" / "core.yaml").read_text())
        z.writestr("eval_bundle/../../escaped.txt", "x")
    server = Server(bad.read_bytes(), "eval_bundle.zip")
    try:
        with pytest.raises(UserError, match="would be written outside"):
            core_eval.download(server.url, tmp_path / "cache2")
    finally:
        server.close()
    assert not (tmp_path / "escaped.txt").exists() and not (tmp_path / "cache2" / "eval_bundle").exists()
    assert [p.name for p in (tmp_path / "cache2").iterdir()] == ["eval_bundle.zip"]  # kept: delete it, or --data


def test_offline_names_data_dir(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # a closed loopback port
    with pytest.raises(UserError, match=r"offline\? pass the unpacked bundle .* with --data DIR"):
        core_eval.download(f"http://127.0.0.1:{port}/eval_bundle.zip", tmp_path / "cache")


def test_a_qwen3_shaped_export_scores_as_its_model_pt(tmp_path, capsys):
    import export_hf
    from helpers import tiny_export

    shape = dict(pos_emb="rope", norm="rmsnorm", mlp="swiglu", bias=False, n_kv_head=1, qk_norm=True, n_head=2,
                 n_embd=16, block_size=48)
    model_pt = tiny_export(tmp_path / "m", seed=5, **shape)
    assert export_hf.main([str(model_pt), str(tmp_path / "hf")]) == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["architectures"] == ["Qwen3ForCausalLM"]
    write_core_bundle(tmp_path / "b", CORE_BUNDLE)
    got = {}
    for name, src in (("pt", model_pt), ("hf", tmp_path / "hf")):
        out = tmp_path / f"{name}.json"
        assert eval_script.main([str(src), "--task", "core", "--data", str(tmp_path / "b"), "--out", str(out)]) == 0
        got[name] = json.loads(out.read_text())
    assert got["hf"]["predictions"] == got["pt"]["predictions"] and got["hf"]["core"] == got["pt"]["core"]
    assert got["pt"]["n"] == sum(len(rows) for _, _, rows, *_ in CORE_BUNDLE.values())
