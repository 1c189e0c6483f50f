"""export.py: a checkpoint becomes actor.pt (TorchScript) and actor.onnx whose actions, on observations recorded from
the env, equal the trainer's deterministic evaluation actions; a VLA is exported by save_pretrained (LoRA merged);
bad input is one line.

Every checkpoint comes from a trainer run of two tiny iterations in this process (one per module). The ONNX file
needs the `export` extra (onnx, onnxscript, onnxruntime): without it those checks are skipped, except in CI (which
installs it), where its absence fails them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from cleanrl_embodied import export, grpo, ppo_continuous, ppo_ddp, ppo_vla, shared
from tests.checks import one_line_exit

TINY = dict(
    num_envs=8, num_steps=10, num_minibatches=2, update_epochs=1, num_eval_envs=2, num_eval_episodes=2,
    eval_freq=0, save_freq=0, cuda=False, compile="off", total_timesteps=160,
)  # fmt: skip
PIXELS = json.dumps({"obs_mode": "state+rgb", "image_size": 32})
LANGUAGE = json.dumps({"obs_mode": "proprio+rgb", "image_size": 32})  # PushCubeLangRL: image, state, instruction
pytestmark = [
    pytest.mark.filterwarnings("ignore:`torch.jit.:FutureWarning"),  # TorchScript is deprecated, still here
    pytest.mark.usefixtures("offline_hub"),  # tests/conftest.py
]


def onnxruntime():
    """onnxruntime, or a skip where the `export` extra is not installed (CI installs it: there, a failure)."""
    if os.environ.get("CI"):
        import onnxruntime as ort

        return ort
    return pytest.importorskip("onnxruntime", reason="the ONNX file needs the export extra (uv sync --extra export)")


def has_onnx_export() -> bool:
    try:
        import onnx  # noqa: F401
        import onnxscript  # noqa: F401
    except ImportError:
        if os.environ.get("CI"):
            raise
        return False
    return True


def train(module, tmp_path: Path, **overrides) -> str:
    """A run of two tiny iterations; the path of its last checkpoint."""
    args = module.Args(**{**TINY, "output_dir": str(tmp_path), **overrides})
    result = module.main(args)
    return str(Path(result["run_dir"]) / "checkpoints" / "last.pt")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """The checkpoints the tests export, each trained once for the whole module."""
    root = tmp_path_factory.mktemp("runs")
    torch.set_num_threads(1)
    os.environ.setdefault("WANDB_MODE", "disabled")
    return {
        "state": train(ppo_continuous, root, norm_obs=True, hidden_sizes=(32, 32)),
        "pixels": train(ppo_continuous, root, norm_obs=True, env_kwargs=PIXELS, hidden_sizes=(32, 32)),
        "grpo": train(grpo, root, env_id="PushCubeLangRL", env_kwargs=LANGUAGE, group_size=4, hidden_sizes=(32, 32)),
    }


def run_export(checkpoint: str, out: Path, **overrides) -> dict:
    return export.main(export.Args(checkpoint=checkpoint, out=str(out), **overrides))


def trainer_policy(checkpoint: str):
    """(trainer module, its args, the policy built as the trainer builds it with the checkpoint's weights, the eval
    envs' spaces' env options), without export.py's own code."""
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    module = {"ppo_continuous": ppo_continuous, "grpo": grpo, "ppo_ddp": ppo_ddp, "ppo_vla": ppo_vla}[ckpt["script"]]
    args = module.Args(**{k: tuple(v) if isinstance(v, list) else v for k, v in ckpt["args"].items()})
    envs = shared.make_env(args.env_id, num_envs=2, seed=0, **json.loads(args.env_kwargs))
    agent = module.make_agent(envs, args)
    if getattr(args, "privileged_critic", False) and module is ppo_vla:  # as ppo_vla.main wraps it
        agent = ppo_vla.PrivilegedCritic(agent, envs.single_observation_space)
    agent.load_state_dict(ckpt["model"], strict=False)
    return module, args, agent.eval()


def recorded_observations(env_id: str, env_kwargs: str, seed: int = 123, num_envs: int = 5, steps: int = 6):
    """Observations of `steps` env steps under random actions (other seeds and sizes than export.py's own check)."""
    envs = shared.make_env(env_id, num_envs=num_envs, seed=seed, **json.loads(env_kwargs))
    generator = torch.Generator().manual_seed(seed)
    obs, _ = envs.reset(seed=seed)
    batches = [obs]
    for _ in range(steps - 1):
        action = torch.rand((num_envs, *envs.single_action_space.shape), generator=generator) * 2 - 1
        obs, *_ = envs.step(action)
        batches.append(obs)
    return torch.cat(batches)


def trainer_actions(checkpoint: str, obs, clip: bool = True) -> torch.Tensor:
    """The trainer's deterministic evaluation actions (`eval_action(..., deterministic=True)`), clipped to the
    action bounds as the env clips what it gets."""
    module, args, agent = trainer_policy(checkpoint)
    with torch.no_grad():
        if module is ppo_vla:
            action = ppo_vla.eval_action(agent, obs, None, None, deterministic=True, size=10**9)
        else:
            action = module.eval_action(agent, obs, None, None, deterministic=True)
    return action.clamp(-1.0, 1.0) if clip else action  # PushCubeRL's action bounds


def inputs_of(description: dict, obs) -> list[torch.Tensor]:
    """The exported actor's inputs built from export.json alone, as a robot's code would: by name and order."""
    tensors = []
    for entry in description["inputs"]:
        value = obs if entry["key"] == [] else obs.get(tuple(entry["key"]))
        assert list(value.shape[1:]) == entry["shape"][1:] and str(value.dtype) == f"torch.{entry['dtype']}"
        tensors.append(value)
    return tensors


def torchscript_actions(out: Path, tensors: list[torch.Tensor]) -> torch.Tensor:
    with torch.no_grad():
        return torch.jit.load(str(out / "actor.pt"))(*tensors)


def onnx_actions(out: Path, description: dict, tensors: list[torch.Tensor]) -> torch.Tensor:
    session = onnxruntime().InferenceSession(str(out / "actor.onnx"), providers=["CPUExecutionProvider"])
    assert [i.name for i in session.get_inputs()] == [e["name"] for e in description["inputs"]]
    feed = {e["name"]: t.numpy() for e, t in zip(description["inputs"], tensors)}
    return torch.from_numpy(session.run(None, feed)[0])


# ---- the exported files act as the trainer's deterministic evaluation --------------------------------------------
@pytest.mark.parametrize(
    "name, env_id, env_kwargs, names",
    [
        ("state", "PushCubeRL", "{}", ["obs"]),
        ("pixels", "PushCubeRL", PIXELS, ["rgb", "state"]),
        ("grpo", "PushCubeLangRL", LANGUAGE, ["instruction/attention_mask", "instruction/input_ids", "rgb", "state"]),
    ],
)
def test_exported_files_give_the_trainers_deterministic_actions(checkpoints, tmp_path, name, env_id, env_kwargs, names):
    onnx = has_onnx_export()
    description = run_export(checkpoints[name], tmp_path, onnx=onnx)
    assert [entry["name"] for entry in description["inputs"]] == names
    assert json.loads((tmp_path / "export.json").read_text()) == description
    assert description["check"]["torchscript_max_abs_diff"] == 0.0
    obs = recorded_observations(env_id, env_kwargs)
    reference = trainer_actions(checkpoints[name], obs)
    assert reference.shape == (30, 7) and reference.abs().max() > 0
    tensors = inputs_of(description, obs)
    assert torch.allclose(torchscript_actions(tmp_path, tensors), reference, rtol=0, atol=1e-6)
    if onnx:
        assert torch.allclose(onnx_actions(tmp_path, description, tensors), reference, rtol=0, atol=1e-5)
    # the normalizer's statistics travel in the files (two iterations moved them away from 0 / 1)
    model = torch.load(checkpoints[name], weights_only=True)["model"]
    if "obs_rms.mean" in model:
        assert description["normalization"] == "inside the actor, frozen" and model["obs_rms.mean"].abs().sum() > 0


def test_torchscript_file_runs_in_a_process_that_imports_only_torch(checkpoints, tmp_path):
    description = run_export(checkpoints["pixels"], tmp_path / "out", onnx=False)
    obs = recorded_observations("PushCubeRL", PIXELS)
    torch.save(inputs_of(description, obs), tmp_path / "inputs.pt")
    code = textwrap.dedent(f"""
        import sys, torch
        torch.set_num_threads(1)
        extra = {{"export.json": ""}}
        actor = torch.jit.load({str(tmp_path / "out" / "actor.pt")!r}, _extra_files=extra)
        with torch.no_grad():
            action = actor(*torch.load({str(tmp_path / "inputs.pt")!r}))
        torch.save(action, {str(tmp_path / "action.pt")!r})
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("cleanrl_embodied", "tensordict", "gymnasium"))
        assert not loaded, loaded
        print(extra["export.json"].decode() if isinstance(extra["export.json"], bytes) else extra["export.json"])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {k: v for k, v in description.items() if k != "check"}  # embedded in the file
    action = torch.load(tmp_path / "action.pt")
    assert torch.allclose(action, trainer_actions(checkpoints["pixels"], obs), rtol=0, atol=1e-6)


def test_actions_are_clipped_to_the_bounds_as_the_env_clips_them_or_not_with_no_clip(checkpoints, tmp_path):
    """Large weights push the mean past [-1, 1]: the default export clips it as the env does, --no-clip gives the
    trainer's unclipped evaluation action."""
    ckpt = torch.load(checkpoints["state"], weights_only=True)
    weights = [k for k in ckpt["model"] if k.startswith("actor_mean.") and k.endswith(".weight")]
    last = max(weights, key=lambda k: int(k.split(".")[1]))  # the output layer
    ckpt["model"][last] = ckpt["model"][last] * 1000.0
    path = str(tmp_path / "big.pt")
    torch.save(ckpt, path)
    obs = recorded_observations("PushCubeRL", "{}")
    raw = trainer_actions(path, obs, clip=False)
    assert (raw.abs() > 1).float().mean() > 0.2  # many entries past the bounds
    for clip in (True, False):
        out = tmp_path / f"clip_{clip}"
        description = run_export(path, out, clip=clip, onnx=False)
        assert description["action"]["clipped"] is clip
        action = torchscript_actions(out, inputs_of(description, obs))
        assert torch.allclose(action, raw.clamp(-1, 1) if clip else raw, rtol=0, atol=1e-5)


def test_ppo_ddp_checkpoint_exports_like_ppo_continuous(tmp_path):
    checkpoint = train(ppo_ddp, tmp_path, norm_obs=True, hidden_sizes=(32, 32))
    description = run_export(checkpoint, tmp_path / "out", onnx=False)
    assert description["source"]["script"] == "ppo_ddp"
    obs = recorded_observations("PushCubeRL", "{}")
    action = torchscript_actions(tmp_path / "out", inputs_of(description, obs))
    assert torch.allclose(action, trainer_actions(checkpoint, obs), rtol=0, atol=1e-6)


def test_a_vla_trainers_bins_and_chunks_are_decoded_in_the_exported_actor(tmp_path):
    """ppo_vla with a traceable policy (tests/toy_policies.py's ToyVLA): the file gives the most likely bin's centre
    for each of the chunk's K actions, [B, K, D], as the VLA trainers' deterministic evaluation."""
    checkpoint = train(
        ppo_vla, tmp_path, env_id="PushCubeRL", policy="toy_policies:ToyVLA", action_head="bins", action_bins=5,
        action_chunk=2, num_envs=4, num_steps=4, num_minibatches=1, total_timesteps=32,
    )  # fmt: skip
    onnx = has_onnx_export()
    description = run_export(checkpoint, tmp_path / "out", onnx=onnx)
    assert description["outputs"][0]["shape"] == ["batch", 2, 7] and description["action"]["chunk"] == 2
    obs = recorded_observations("PushCubeRL", "{}")
    reference = trainer_actions(checkpoint, obs)
    centres = torch.linspace(-0.8, 0.8, 5)  # bin centres of [-1, 1] in 5 bins
    assert torch.isclose(reference.unsqueeze(-1), centres).any(-1).all()
    tensors = inputs_of(description, obs)
    assert torch.equal(torchscript_actions(tmp_path / "out", tensors), reference)
    if onnx:
        assert torch.allclose(onnx_actions(tmp_path / "out", description, tensors), reference, rtol=0, atol=1e-6)


# ---- VLA policies: export is save_pretrained, the LoRA adapters merged ---------------------------------------------
def test_a_lora_vla_is_exported_merged_and_reloads_with_from_pretrained_as_the_policy_acted(tmp_path):
    pytest.importorskip("peft")
    from transformers import PaliGemmaForConditionalGeneration

    from examples.hf_vla import make_policy

    env_kwargs = json.dumps({"obs_mode": "rgb", "image_size": 32, "action_mode": "ee_delta_pos"})
    checkpoint = train(
        ppo_vla, tmp_path, env_id="PushCubeLangRL", env_kwargs=env_kwargs, policy="examples.hf_vla:make_policy",
        policy_kwargs=json.dumps({"lora_rank": 4}), action_head="bins", action_bins=16, num_envs=4, num_steps=4,
        num_minibatches=1, total_timesteps=16,
    )  # fmt: skip
    model = torch.load(checkpoint, weights_only=True)["model"]
    assert any("lora_B" in k and v.abs().sum() > 0 for k, v in model.items())  # the adapters learned something
    out = tmp_path / "vla"
    description = run_export(checkpoint, out)
    assert description["kind"] == "save_pretrained" and "inputs" not in description
    assert {"config.json", "model.safetensors", "heads.safetensors", "vla_config.json", "export.json"} <= {
        p.name for p in out.iterdir()
    }
    # the backbone alone is a plain transformers model: no adapter weights left, they are in its weights
    backbone = PaliGemmaForConditionalGeneration.from_pretrained(out)
    assert not any("lora" in name for name in backbone.state_dict())
    _, args, policy = trainer_policy(checkpoint)  # the checkpoint's policy, adapters on
    envs = shared.make_env("PushCubeLangRL", num_envs=2, seed=0, **json.loads(env_kwargs))
    loaded = make_policy(envs.single_observation_space, envs.single_action_space, args, model_path=str(out))
    obs = recorded_observations("PushCubeLangRL", env_kwargs, num_envs=3, steps=2)
    with torch.no_grad():
        mine, theirs = policy.dist(obs), loaded.dist(obs)
        assert torch.allclose(mine.logits, theirs.logits, rtol=0, atol=1e-5)
        assert torch.equal(
            ppo_vla.eval_action(policy, obs, None, None, True, 64),
            ppo_vla.eval_action(loaded, obs, None, None, True, 64),
        )


def test_a_vla_with_a_privileged_critic_exports_its_actor_in_every_format(tmp_path, capfd):
    """ppo_vla --privileged-critic wraps the policy with the trainer's own critic MLP: export finds the policy inside
    (its save_pretrained, its actions) and writes the actor alone, as for the policy without that critic."""
    pytest.importorskip("peft")
    from examples.hf_vla import make_policy

    env_kwargs = json.dumps({"obs_mode": "state+rgb", "image_size": 32, "action_mode": "ee_delta_pos",
                             "privileged_state": True})  # fmt: skip
    checkpoint = train(
        ppo_vla, tmp_path, env_id="PushCubeLangRL", env_kwargs=env_kwargs, policy="examples.hf_vla:make_policy",
        policy_kwargs=json.dumps({"lora_rank": 4}), action_head="bins", action_bins=16, privileged_critic=True,
        num_envs=4, num_steps=4, num_minibatches=1, total_timesteps=16,
    )  # fmt: skip
    assert any(k.startswith("critic.") for k in torch.load(checkpoint, weights_only=True)["model"])
    _, args, wrapper = trainer_policy(checkpoint)
    obs = recorded_observations("PushCubeLangRL", env_kwargs, num_envs=3, steps=2)
    for fmt in ("auto", "pretrained"):  # auto: the policy's save_pretrained, as for the policy alone
        out = tmp_path / fmt
        description = run_export(checkpoint, out, format=fmt)
        assert description["kind"] == "save_pretrained"
        envs = shared.make_env("PushCubeLangRL", num_envs=2, seed=0, **json.loads(env_kwargs))
        loaded = make_policy(envs.single_observation_space, envs.single_action_space, args, model_path=str(out))
        with torch.no_grad():
            assert torch.allclose(wrapper.dist(obs).logits, loaded.dist(obs).logits, rtol=0, atol=1e-5)
    capfd.readouterr()
    description = run_export(checkpoint, tmp_path / "trace", format="trace", onnx=False)
    names = [entry["name"] for entry in description["inputs"]]
    assert "rgb" in names and not any(name.startswith(shared.PRIVILEGED_KEY) for name in names)
    traced = torch.jit.load(str(tmp_path / "trace" / "actor.pt"))
    assert not any(".critic." in name or name.startswith("agent.critic") for name in traced.state_dict())
    assert torch.equal(
        torchscript_actions(tmp_path / "trace", inputs_of(description, obs)), trainer_actions(checkpoint, obs)
    )
    if has_onnx_export():  # the policy's bins do not pass torch.export (a data-dependent check): one line, no graph
        with pytest.raises(SystemExit) as e:
            run_export(checkpoint, tmp_path / "onnx", format="trace")
        assert "cannot be exported to ONNX" in one_line_exit(e) and "--no-onnx" in one_line_exit(e)
        assert "def forward" not in capfd.readouterr().err


# ---- bad input: one line ------------------------------------------------------------------------------------------
def test_a_checkpoint_of_a_trainer_file_that_is_not_here_is_one_line_asking_for_it(tmp_path):
    path = tmp_path / "other.pt"
    torch.save({"script": "sac", "args": {}, "model": {}}, path)
    with pytest.raises(SystemExit) as e:
        run_export(str(path), tmp_path / "out")
    line = one_line_exit(e)
    assert "--checkpoint" in line and "sac.py" in line and "--trainer" in line
    with pytest.raises(SystemExit) as e:
        run_export(str(tmp_path / "missing.pt"), tmp_path / "out")
    assert "--checkpoint" in one_line_exit(e) and "missing.pt" in one_line_exit(e)


def test_a_policy_that_a_trace_cannot_hold_is_one_line_naming_it(tmp_path):
    checkpoint = train(ppo_continuous, tmp_path, policy="export_policies:numpy_mean", hidden_sizes=(32, 32))
    with pytest.raises(SystemExit) as e:  # the trace keeps the example's numbers: the check finds other actions
        run_export(checkpoint, tmp_path / "out", onnx=False)
    line = one_line_exit(e)
    assert "--policy export_policies:numpy_mean cannot be traced" in line
    if has_onnx_export():  # torch.export refuses numpy on its symbolic tensors outright
        with pytest.raises(SystemExit) as e:
            run_export(checkpoint, tmp_path / "out")
        assert "--policy export_policies:numpy_mean" in one_line_exit(e)
    assert not any((tmp_path / "out").iterdir())  # no file the check did not pass is left behind


def test_the_actor_takes_no_privileged_entry_and_asking_for_one_is_one_line(tmp_path):
    checkpoint = train(ppo_continuous, tmp_path, policy="export_policies:privileged_state", env_kwargs=PIXELS)
    description = run_export(checkpoint, tmp_path / "out", onnx=False)
    assert [entry["name"] for entry in description["inputs"]] == ["rgb"]  # the critic's state is not an input
    obs = recorded_observations("PushCubeRL", PIXELS)
    action = torchscript_actions(tmp_path / "out", inputs_of(description, obs))
    assert torch.allclose(action, trainer_actions(checkpoint, obs), rtol=0, atol=1e-6)
    with pytest.raises(SystemExit) as e:
        run_export(checkpoint, tmp_path / "out", inputs=("rgb", "state"), onnx=False)
    assert "--inputs state" in one_line_exit(e) and "privileged" in one_line_exit(e)
    # a policy that declares the state privileged but reads it in its action is refused
    ckpt = torch.load(checkpoint, weights_only=True)
    ckpt["args"]["policy_kwargs"] = json.dumps({"leak": True})
    torch.save(ckpt, tmp_path / "leak.pt")
    with pytest.raises(SystemExit) as e:
        run_export(str(tmp_path / "leak.pt"), tmp_path / "out", onnx=False)
    assert "reads the privileged entry state" in one_line_exit(e)


def test_inputs_must_be_exactly_the_entries_the_actor_reads(checkpoints, tmp_path):
    description = run_export(checkpoints["pixels"], tmp_path, inputs=("state", "rgb"), onnx=False)
    assert [entry["name"] for entry in description["inputs"]] == ["state", "rgb"]  # in the order asked for
    obs = recorded_observations("PushCubeRL", PIXELS)
    action = torchscript_actions(tmp_path, inputs_of(description, obs))
    assert torch.allclose(action, trainer_actions(checkpoints["pixels"], obs), rtol=0, atol=1e-6)
    for inputs, words in ((("rgb",), "also reads state"), (("rgb", "depth"), "--inputs depth: the observation has no")):
        with pytest.raises(SystemExit) as e:
            run_export(checkpoints["pixels"], tmp_path, inputs=inputs, onnx=False)
        assert words in one_line_exit(e)


def test_command_line_prints_one_line_and_exits_1(tmp_path):
    done = subprocess.run(
        [sys.executable, str(Path(export.__file__)), "--checkpoint", str(tmp_path / "nope.pt")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and done.stderr.strip().splitlines() == [
        f"error: --checkpoint: no such checkpoint file {str(tmp_path / 'nope.pt')!r}"
    ]


def test_observations_tensordict_input_order_is_sorted_key_order():
    space = shared.make_env("PushCubeLangRL", num_envs=2, seed=0, **json.loads(LANGUAGE)).single_observation_space
    keys = export.entry_keys(space)
    assert keys == sorted(keys) and ("instruction", "input_ids") in keys
    obs = TensorDict({"a": torch.zeros(2, 1), "b": {"c": torch.ones(2, 3)}}, batch_size=[2])
    again = export.assemble([("a",), ("b", "c")], (obs["a"], obs["b", "c"]))
    assert (again == obs).all()


# ---- the docs' control loop ---------------------------------------------------------------------------------------
def docs_control_loop() -> str:
    """The Python block of docs/export.md that defines `control_loop`."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "export.md").read_text()
    blocks = [b for b in text.split("```python\n")[1:] if "def control_loop" in b.split("```")[0]]
    assert len(blocks) == 1
    return blocks[0].split("```")[0]


class SimulatedRobot:
    """A PushCubeRL env with pixels as the robot of docs/export.md's loop: its camera and state, and `send`."""

    def __init__(self):
        self.env = shared.make_env("PushCubeRL", num_envs=1, seed=7, **json.loads(PIXELS))
        self.obs, _ = self.env.reset(seed=7)
        self.seen, self.sent = [], []

    def camera_image(self):
        return self.obs["rgb"][0].numpy()

    def state_vector(self):
        return self.obs["state"][0].numpy()

    def send(self, action):
        self.seen.append(self.obs)
        self.sent.append(torch.as_tensor(action))
        self.obs, *_ = self.env.step(torch.as_tensor(action)[None])


def test_the_docs_control_loop_sends_the_trainers_actions(checkpoints, tmp_path):
    run_export(checkpoints["pixels"], tmp_path, onnx=False)
    namespace: dict = {}
    exec(compile(docs_control_loop(), "docs/export.md", "exec"), namespace)
    namespace["CONTROL_HZ"] = 1e6  # the test does not wait for a real control period
    robot = SimulatedRobot()
    namespace["control_loop"](robot, str(tmp_path / "actor.pt"), steps=5)
    assert len(robot.sent) == 5
    reference = trainer_actions(checkpoints["pixels"], torch.cat(robot.seen))
    assert torch.allclose(torch.stack(robot.sent), reference, rtol=0, atol=1e-6)


def test_onnx_without_the_export_extra_is_one_line_and_no_onnx_writes_actor_pt_alone(
    checkpoints, tmp_path, monkeypatch
):
    import importlib.util

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "onnxscript" else find_spec(name, *a)
    )
    with pytest.raises(SystemExit) as e:
        run_export(checkpoints["state"], tmp_path)
    assert "onnxscript" in one_line_exit(e) and "--no-onnx" in one_line_exit(e)
    description = run_export(checkpoints["state"], tmp_path, onnx=False)
    assert description["files"] == {"torchscript": "actor.pt", "onnx": None}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["actor.pt", "export.json"]
