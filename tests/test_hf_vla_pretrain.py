"""examples/hf_vla's pretraining, demonstrations and few-shot fine-tuning (pretrain.py, demos.py, fewshot.py): what
the corpus holds and holds out, the output loading as a released VLA does, K demonstrations per task, bit-identical
resume after a stop (pretraining, few-shot SFT, RL from a few-shot start), DAgger from a few-shot start, and the
one-line refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

try:
    import peft  # noqa: F401
    import transformers  # noqa: F401
except ImportError:
    if os.environ.get("CI"):
        raise
    pytest.skip("examples.hf_vla needs the vla extra (uv sync --extra vla)", allow_module_level=True)

from cleanrl_embodied import ppo_vla
from cleanrl_embodied.shared.envs import make_env
from cleanrl_embodied.shared.envs.push_cube import HELDOUT_INSTRUCTIONS, LANG_TASKS, TASKS
from cleanrl_embodied.shared.language import decode_instructions
from examples.hf_vla import dagger, demos, fewshot, pretrain
from examples.hf_vla.factory import make_policy
from tests.checks import one_line_exit

SIZE = 32  # 2x2 patches: the smallest images, for speed
TARGET = {**demos.TARGET_ENV, "image_size": SIZE}
PRETRAIN = dict(episodes=8, wrist_episodes=0, layouts=("proprio_rgb", "state_rgb"), num_envs=8, image_size=SIZE,
                steps=4, save_every=2, batch_size=8, eval_episodes=4, num_eval_envs=4,
                policy_kwargs=json.dumps({"hidden_size": 32, "intermediate_size": 64, "head_hidden": 16}))  # fmt: skip
FEWSHOT = dict(k=2, steps=4, save_every=2, batch_size=8, eval_episodes=4, num_eval_envs=4,
               policy_kwargs=json.dumps({"lora_rank": 4}))  # fmt: skip


pytestmark = pytest.mark.usefixtures("offline")  # tests/conftest.py


class StopAtStep:
    """Stands in for shared.stop_signals.StopFlag: a stop is requested at the given step (each step asks twice)."""

    def __init__(self, step: int):
        self.calls, self.step, self.exit_status = 0, step, 130

    def __call__(self, say):
        return self

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    @property
    def requested(self) -> bool:
        self.calls += 1
        return self.calls > 2 * (self.step - 1)


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pretrained")
    pretrain.main(pretrain.Args(out=str(out), **PRETRAIN))
    return out


@pytest.fixture(scope="module")
def demo_file(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("demos") / "demos.pt"
    demos.main(demos.Args(out=str(out), per_task=3, env_kwargs=json.dumps(TARGET), num_envs=8))
    return out


@pytest.fixture(scope="module")
def start(pretrained, demo_file, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fewshot")
    fewshot.main(fewshot.Args(base=str(pretrained / "proprio_rgb"), demos=str(demo_file), out=str(out), **FEWSHOT))
    return out


def test_phrasings_are_many_fit_the_observation_and_hold_out_every_paraphrase():
    held = {t for phrases in HELDOUT_INSTRUCTIONS.values() for t in phrases}
    for task, (_, instruction) in TASKS.items():
        texts = pretrain.phrasings(task)
        assert instruction in texts and len(texts) >= 20 and len(set(texts)) == len(texts)
        assert not set(texts) & held and all(len(t.encode()) <= 32 for t in texts)
        others = {t for other in TASKS if other != task for t in pretrain.phrasings(other)}
        assert not set(texts) & others  # a phrasing names one task
    # every word of the held-out paraphrases is in the corpus (pretrained language), no paraphrase is
    words = {w for task in TASKS for t in pretrain.phrasings(task) for w in t.split()}
    assert {w for t in held for w in t.split()} <= words


def test_the_corpus_holds_the_pretraining_tasks_only_and_their_localisation_targets():
    args = pretrain.Args(**{**PRETRAIN, "episodes": 12})
    corpus = pretrain.record_corpus(args, ("top",), args.episodes, seed=3)
    assert set(corpus["task"].tolist()) <= set(range(len(args.tasks))) and len(set(corpus["task"].tolist())) > 2
    texts = set(decode_instructions(corpus["obs"]["instruction"]))
    assert texts <= {TASKS[t][1] for t in args.tasks}
    assert not texts & {TASKS[t][1] for t in args.heldout_tasks}
    state = corpus["obs"]["state"]  # cube xy at 17:19, TCP-to-cube xy at 22:24 of PushCubeLangRL's state
    assert torch.equal(corpus["loc"], torch.cat([state[:, 17:19], state[:, 22:24]], -1))
    assert corpus["obs"]["rgb"].shape[1:] == (3, SIZE, SIZE)
    episodes = sum(int(corpus["demo"][corpus["task"] == t].max()) + 1 for t in set(corpus["task"].tolist()))
    assert episodes == 12  # the first 12 episodes that ended, successful or not (DART)


def test_the_pretraining_output_loads_as_a_released_vla_for_an_unseen_task(pretrained):
    report = json.loads((pretrained / "pretrain.json").read_text())
    assert set(report["eval"]) == {"proprio_rgb", "state_rgb"} and report["cpu_s"] > 0
    for cases in report["eval"].values():
        assert set(cases) == {"pretraining_tasks", "pretraining_tasks_heldout_phrasings", "heldout_tasks"}
    env = make_env("PushCubeLangRL", num_envs=3, seed=0, **TARGET)  # the held-out diagonal tasks
    head = SimpleNamespace(action_head="bins", action_bins=16, action_chunk=1)
    directory = pretrained / "proprio_rgb"
    for name in ("config.json", "model.safetensors", "vla_config.json", "dataset_statistics.json", pretrain.MARKER):
        assert (directory / name).is_file(), name
    policy = make_policy(env.single_observation_space, env.single_action_space, head, model_path=str(directory))
    obs, _ = env.reset(seed=1)
    with torch.no_grad():
        assert policy.dist(obs).mode.shape == (3, 3)
    fresh = make_policy(env.single_observation_space, env.single_action_space, head,
                        **json.loads(PRETRAIN["policy_kwargs"]))  # fmt: skip
    trained, built = (dict(p.backbone.named_parameters()) for p in (policy, fresh))
    name = next(n for n in built if n.endswith("vision_tower.embeddings.patch_embedding.weight"))
    assert not torch.equal(trained[name], built[name])  # the vision tower trained (full-parameter pretraining)
    # the two layouts share the backbone: their saved weights are equal
    other = (pretrained / "state_rgb" / "model.safetensors").read_bytes()
    assert other == (directory / "model.safetensors").read_bytes()


def test_pretraining_resumes_bit_identically_after_a_stop(pretrained, tmp_path, monkeypatch):
    monkeypatch.setattr(pretrain, "StopFlag", StopAtStep(3))
    with pytest.raises(SystemExit) as stopped:
        pretrain.main(pretrain.Args(out=str(tmp_path), **PRETRAIN))
    assert stopped.value.code == 130
    assert torch.load(tmp_path / "checkpoint.pt", weights_only=True)["step"] == 3
    monkeypatch.undo()
    pretrain.main(pretrain.Args(out=str(tmp_path), resume=str(tmp_path / "checkpoint.pt"), **PRETRAIN))
    straight, resumed = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (pretrained, tmp_path))
    assert straight["step"] == resumed["step"] == 4
    for layout, state in straight["policies"].items():
        for key, value in state.items():
            assert torch.equal(value, resumed["policies"][layout][key]), (layout, key)


def test_k_demonstrations_per_task_are_the_first_k_of_the_file(demo_file):
    samples, meta = demos.load_demos(str(demo_file), k=2)
    assert meta["per_task"] == 3 and meta["task_names"] == ["forward_right", "back_left"]
    for task in (0, 1):
        assert set(samples["demo"][samples["task"] == task].tolist()) == {0, 1}
    env = make_env("PushCubeLangRL", num_envs=8, seed=1, **TARGET)
    again = demos.record(env, 1, per_task=2)  # recording two per task gives the same first two
    assert torch.equal(again["actions"], samples["actions"])
    assert torch.equal(again["obs"]["rgb"], samples["obs"]["rgb"])
    with pytest.raises(SystemExit) as e:
        demos.load_demos(str(demo_file), k=4)
    assert "--k 4" in one_line_exit(e) and "holds 3 demonstrations per task" in str(e.value.code)


def test_state_mode_demos_are_saved_and_read_back_as_a_plain_tensor(tmp_path):
    """PushCubeRL's default observation (obs_mode "state": one tensor [N, D], no TensorDict) is recorded, written
    and read back as a tensor [S, D], the same samples record() gives; fewshot.py refuses such a file for a base
    pretrained on images in one line naming obs_mode."""
    out = tmp_path / "state.pt"
    demos.main(demos.Args(out=str(out), per_task=2, env_id="PushCubeRL", env_kwargs="{}", num_envs=4))
    samples, meta = demos.load_demos(str(out), k=1)
    assert meta["env_id"] == "PushCubeRL" and meta["env_kwargs"] == {} and meta["task_names"] == ["task"]
    env = make_env("PushCubeRL", num_envs=4, seed=1)
    again = demos.record(env, 1, per_task=1)  # the first episode of the file, recorded again
    dim = env.single_observation_space.shape[0]
    assert torch.is_tensor(samples["obs"]) and samples["obs"].shape == (len(samples["actions"]), dim)
    assert torch.equal(again["obs"], samples["obs"]) and torch.equal(again["actions"], samples["actions"])
    assert set(samples["demo"].tolist()) == {0}
    base = tmp_path / "base"  # what fewshot.py checks before it loads a model: the base's pretrained.json
    base.mkdir()
    (base / pretrain.MARKER).write_text(json.dumps({"env_kwargs": TARGET}))
    with pytest.raises(SystemExit) as e:
        fewshot.setup(fewshot.Args(base=str(base), demos=str(out), out=str(tmp_path / "x")))
    assert "recorded with obs_mode 'state', the base" in one_line_exit(e)


def test_fewshot_trains_lora_on_the_k_demos_and_resumes_bit_identically(pretrained, demo_file, start, tmp_path,
                                                                        monkeypatch):  # fmt: skip
    report = json.loads((start / "fewshot.json").read_text())
    assert report["recipe"]["k"] == 2 and report["samples"] == len(demos.load_demos(str(demo_file), 2)[0]["actions"])
    assert report["env_kwargs"] == TARGET and 0.0 <= report["eval"]["success_rate"] <= 1.0
    base = dict(base=str(pretrained / "proprio_rgb"), demos=str(demo_file), out=str(tmp_path), **FEWSHOT)
    monkeypatch.setattr(fewshot, "StopFlag", StopAtStep(3))
    with pytest.raises(SystemExit):
        fewshot.main(fewshot.Args(**base))
    monkeypatch.undo()
    fewshot.main(fewshot.Args(**base, resume=str(tmp_path / "checkpoint.pt")))
    straight, resumed = (torch.load(d / "checkpoint.pt", weights_only=True) for d in (start, tmp_path))
    assert straight["step"] == resumed["step"] == 4 and straight["model"].keys() == resumed["model"].keys()
    assert all(torch.equal(v, resumed["model"][k]) for k, v in straight["model"].items())
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in straight["model"].items())  # the adapters trained


def test_the_control_continues_the_start_on_its_demos_for_a_cpu_budget(start, tmp_path):
    """How many steps fit in the 0.6 s CPU budget depends on the machine's speed and load: CI on a loaded 2-core
    machine made 15 where the test used to ask for 20 (an evaluation every 20). The curve's evaluations come every 5
    steps, and the test asks for one of them at least."""
    report = fewshot.main(fewshot.Args(start=str(start), out=str(tmp_path), cpu_minutes=0.01, eval_episodes=4,
                                       num_eval_envs=4, batch_size=8, eval_every=5, curve_episodes=4))  # fmt: skip
    assert report["recipe"]["start"] == str(start) and report["recipe"]["k"] == 2
    assert report["train_cpu_s"] >= 0.01 * 60 and report["steps"] >= 5
    points = [c for c in report["curve"] if "success_rate" in c]  # the curve's evaluations, not charged to the budget
    assert [c["step"] for c in points] == list(range(5, report["steps"] + 1, 5)) and points
    assert all(0.0 <= c["success_rate"] <= 1.0 and c["cpu_s"] <= report["train_cpu_s"] for c in points)


def test_dagger_and_rl_start_from_a_fewshot_output_and_rl_resumes_bit_identically(start, tmp_path):
    env_id, env_kwargs, head, seed, (obs, targets) = dagger.start_data(str(start))
    samples, _ = demos.load_demos(json.loads((start / "fewshot.json").read_text())["recipe"]["demos"], k=2)
    assert env_id == "PushCubeLangRL" and env_kwargs == TARGET and seed == 1
    assert torch.equal(targets[:, 0], samples["actions"]) and torch.equal(obs["rgb"], samples["obs"]["rgb"])
    kw = dict(env_id="PushCubeLangRL", env_kwargs=json.dumps(TARGET), seed=1, num_envs=4, num_steps=4,
              num_minibatches=2, update_epochs=1, total_timesteps=3 * 16, eval_freq=0, save_freq=1, num_eval_envs=2,
              num_eval_episodes=2, cuda=False, policy_kwargs=json.dumps({"model_path": str(start)}),
              action_head="bins", action_bins=16, compile="off")  # fmt: skip
    ppo_vla.main(ppo_vla.Args(output_dir=str(tmp_path / "a"), **kw))
    (run,) = (tmp_path / "a").iterdir()
    ppo_vla.main(ppo_vla.Args(output_dir=str(tmp_path / "b"), resume=str(run / "checkpoints" / "iter_000001.pt"),
                              **kw))  # fmt: skip
    (other,) = (tmp_path / "b").iterdir()
    straight, resumed = (torch.load(r / "checkpoints" / "last.pt", weights_only=True) for r in (run, other))
    assert straight["global_step"] == resumed["global_step"] == 48
    assert all(torch.equal(v, resumed["model"][k]) for k, v in straight["model"].items())


def test_bad_input_gets_one_line(pretrained, demo_file, start, tmp_path):
    cases = [
        (dict(base=str(start), demos=str(demo_file)), "not a pretraining output"),
        (dict(base=str(pretrained / "proprio_rgb"), demos=str(demo_file), k=5), "--k 5"),
        (dict(base=str(pretrained / "state_rgb"), demos=str(demo_file)), "recorded with obs_mode 'proprio+rgb'"),
        (dict(base=str(pretrained / "proprio_rgb"), start=str(start)), "give one of --base"),
        (dict(start=str(pretrained / "proprio_rgb")), "no fewshot.json"),
        (dict(base=str(pretrained / "proprio_rgb"), demos=str(tmp_path / "none.pt")), "no such file"),
    ]
    for kwargs, words in cases:
        with pytest.raises(SystemExit) as e:
            fewshot.main(fewshot.Args(out=str(tmp_path / "x"), **kwargs))
        assert words in one_line_exit(e), (kwargs, e.value.code)
    with pytest.raises(SystemExit) as e:
        pretrain.main(pretrain.Args(out=str(tmp_path / "p"), tasks=("forward", "forward_right")))
    assert "--heldout-tasks forward_right: also in --tasks" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        pretrain.main(pretrain.Args(out=str(tmp_path / "p"), layouts=("proprio",)))
    assert "--layouts proprio" in one_line_exit(e)
    with pytest.raises(SystemExit) as e:
        dagger.main(dagger.Args(model_path=str(pretrained / "proprio_rgb"), out=str(tmp_path / "d")))
    assert "no bc_eval.json or fewshot.json" in one_line_exit(e)


def test_view_tasks_give_every_task_set_the_same_window():
    def window(**kw):
        env = make_env("PushCubeLangRL", num_envs=1, seed=0, obs_mode="rgb", image_size=SIZE, **kw)
        view = env.unwrapped._obs_views[0]
        return view.pixel, view.x0, view.y1

    default = window()
    assert window(view_tasks=list(LANG_TASKS)) == default and window(view_tasks=list(TASKS)) == default
    assert window(tasks=["forward_right", "back_left"], view_tasks=list(LANG_TASKS)) == default
    assert window(tasks=["forward_right", "back_left"]) != default  # the window of its own tasks is another
    with pytest.raises(ValueError, match="view_tasks must be null or a list of distinct task names"):
        make_env("PushCubeLangRL", num_envs=1, obs_mode="rgb", view_tasks=["up"])
