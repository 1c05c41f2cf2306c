"""The configuration: every option composes, bad input fails early with a clear message."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from helpers import OPTIM, ROOT, compose_config, task_data
from hydra.core.hydra_config import HydraConfig

from attnlab.config.build import build, to_dict
from attnlab.config.options import COMPOSED_ALONE, options, variant
from attnlab.config.values import check_ranges
from attnlab.errors import ConfigError
from attnlab.model.architecture import Architecture

GROUPS = [
    "task", "pe", "norm", "synthesizer", "block", "model", "trainer", "logger", "callbacks",
    "extras", "debug", "experiment", "hparams_search",
]  # fmt: skip


@pytest.mark.parametrize(
    "group,option", [(group, option) for group in GROUPS for option in options(group)]
)
def test_every_option_composes_and_every_variant_documents_itself(group, option, tmp_path):
    cfg = compose_config([f"{group}={option}"], tmp_path)
    assert cfg.get(group) is not None or group in ("debug", "experiment", "hparams_search")
    check_ranges(to_dict(cfg))  # no default is refused as out of its type's range
    if group in ("pe", "norm", "synthesizer", "task"):
        assert cfg[group].name == option, "the YAML's name must be its file name"
    if group in ("pe", "norm", "synthesizer", "block"):
        node = cfg[group]
        assert node.description and node.paper, f"{group}/{option}.yaml needs description and paper"


def run_cli(*args: str, script: str = "train.py") -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, script, *args], cwd=ROOT, capture_output=True, text=True, timeout=300
    )


def test_a_mistyped_option_lists_the_valid_ones():
    result = run_cli("pe=ropee", "hydra.run.dir=/tmp/attnlab-never")
    assert result.returncode != 0
    assert "attnlab: pe=ropee is not an option (did you mean pe=rope?): pe has " in result.stderr
    assert "search path" not in result.stderr and "Traceback" not in result.stderr
    for option in options("pe"):
        assert option in result.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["-m", "pe=rope,alibee"], "pe=alibee is not an option (did you mean pe=alibi?)"),
        (["experiment=lm_extrapolatoin"], "(did you mean experiment=lm_extrapolation?)"),
        (["task=synthetic/defaultz"], "(did you mean task=synthetic/defaults?)"),
        (["norm=zzz"], "norm=zzz is not an option: norm has "),
    ],
)
def test_a_group_option_that_does_not_exist_is_one_sentence_with_the_closest(args, message):
    from attnlab.runner.preflight import check_group_choices

    with pytest.raises(ConfigError, match=re.escape(message)):
        check_group_choices(args)


def test_existing_group_options_and_sweeps_of_them_pass_the_check():
    from attnlab.runner.preflight import check_group_choices

    check_group_choices(["-m", "pe=rope,alibi", "task=synthetic/defaults", "experiment=null"])
    check_group_choices(["hydra/launcher=joblib", "+trainer.x=1", "~logger", "pe=glob(*)"])


def test_help_lists_every_group_with_its_options_and_default_without_importing_torch():
    program = (
        "import sys; sys.argv = ['train.py', '--help']; "
        "from attnlab.runner.train import main; main(); "
        "assert 'torch' not in sys.modules and 'lightning' not in sys.modules, 'imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "  pe: " + ", ".join(options("pe")) + " (default: sinusoidal)" in done.stdout
    assert "  experiment: " in done.stdout and "(default: none)" in done.stdout


OUT_OF_RANGE = {  # override: the sentence (before: numpy's, islice's or no error at all)
    "seed=-1": "seed=-1 must be an integer from 0 to 4,294,967,295 (numpy's seeds)",
    "seed=4294967296": "seed=4294967296 must be an integer from 0 to 4,294,967,295",
    "task.data.batch_size=99999999999999999999": (
        "task.data.batch_size=99999999999999999999 is beyond the range of a 64-bit integer"
    ),
    "task.optim.lr=1e400": "task.optim.lr=inf is not a finite number (YAML reads 1e400 as inf)",
    "task.optim.betas=[0.9,nan]": "task.optim.betas[1]=nan is not a finite number",
}


@pytest.mark.parametrize(("override", "sentence"), OUT_OF_RANGE.items(), ids=list(OUT_OF_RANGE))
def test_a_setting_out_of_its_types_range_is_refused_before_anything_is_built(
    override, sentence, make_config
):
    from attnlab.runner.train import train

    with pytest.raises(ConfigError, match=re.escape(sentence)):
        train(make_config(["model=tiny", override]))


def test_eval_refuses_a_setting_out_of_range_before_reading_the_checkpoint(make_config, tmp_path):
    from attnlab.runner.evaluate import evaluate

    cfg = make_config([f"ckpt_path={tmp_path / 'never.ckpt'}", "task.optim.lr=1e400"], "eval")
    with pytest.raises(ConfigError, match=re.escape(OUT_OF_RANGE["task.optim.lr=1e400"])):
        evaluate(cfg)


@pytest.mark.slow
def test_a_setting_out_of_range_is_one_sentence_from_train_py(tmp_path):
    result = run_cli("task.optim.lr=1e400", f"hydra.run.dir={tmp_path}")
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "attnlab: task.optim.lr=inf is not a finite number (YAML reads 1e400 as inf): give one"
    )
    assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_an_impossible_model_stops_before_training_with_one_sentence(tmp_path):
    result = run_cli("model.d_model=100", "model.n_heads=3", f"hydra.run.dir={tmp_path}")
    assert result.returncode != 0
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("attnlab: model.d_model=100 is not divisible by model.n_heads=3")
    assert not (tmp_path / "checkpoints").exists()


def test_a_sequence_longer_than_a_length_bound_pe_stops_before_training(make_config):
    from attnlab.runner.train import train

    cfg = make_config(["pe=learned", "pe.max_len=8", "task.data.max_len=16"])
    with pytest.raises(ConfigError, match=r"16 positions .* at most 8 \(pe.max_len\)"):
        train(cfg)


def test_an_unknown_variant_option_names_the_valid_ones():
    node = {"_target_": "attnlab.pe.rope.RoPE", "name": "rope", "bse": 3.0}
    with pytest.raises(ConfigError, match="'rope' has no option bse; its options are: base"):
        build(node, shape=None)


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("base", "abc", "'rope' option base='abc' must be a number"),
        (
            "rotary_dim",
            True,
            "'rope' option rotary_dim=True must be an integer or a number or null",
        ),
        ("rotary_dim", "a", "'rope' option rotary_dim='a' must be an integer or a number or null"),
        ("layout", 3, "'rope' option layout=3 must be a string"),
    ],
)
def test_a_variant_option_of_the_wrong_type_is_one_sentence(option, value, message):
    node = {"_target_": "attnlab.pe.rope.RoPE", "name": "rope", option: value}
    with pytest.raises(ConfigError) as error:
        build(node, shape=None)
    assert str(error.value) == message


def test_an_integer_is_a_number_for_an_option_that_takes_one():
    from attnlab.config.values import fits

    assert fits(["float"], 10000) and fits(["float", "None"], None)
    assert not fits(["int"], True) and not fits(["float"], False) and not fits(["int"], 2.0)


def test_help_and_cfg_job_work():
    help_text = run_cli("--help")
    assert help_text.returncode == 0 and "pe: " in help_text.stdout
    job = run_cli("--cfg", "job", "pe=rope", "norm=l2")
    assert job.returncode == 0
    assert "_target_: attnlab.pe.rope.RoPE" in job.stdout
    assert "_target_: attnlab.norm.l2.L2" in job.stdout


def test_the_probe_table_sweeps_existing_options(tmp_path):
    compose_config(["experiment=probe_table"], tmp_path)
    params = HydraConfig.get().sweeper.params
    assert set(params) == {"pe", "norm", "task.markers", "seed"}
    assert params.seed == "0,1,2"
    assert set(params.pe.split(",")) <= set(options("pe"))
    assert set(params.norm.split(",")) <= set(options("norm"))


@pytest.mark.slow
def test_importing_the_package_registers_no_resolver():
    program = (
        "import attnlab.config.options, attnlab.runner.plan, attnlab.runner.trainer; from omegaconf import OmegaConf; "
        "from attnlab.config.resolvers import register_resolvers; "
        "assert not OmegaConf.has_resolver('unique'), 'registered on import'; "
        "register_resolvers(); assert OmegaConf.has_resolver('unique')"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-1000:]


def test_importing_the_error_type_has_no_side_effect():
    program = (
        "import atexit, sys; before = set(sys.modules); calls = atexit._ncallbacks(); "
        "from attnlab.errors import ConfigError; "
        "assert atexit._ncallbacks() == calls, 'an exit hook registered on import'; "
        "loaded = set(sys.modules) - before; "
        "assert {m for m in loaded if m.startswith('attnlab')} == {'attnlab', 'attnlab.errors'}; "
        "assert not {m.split('.')[0] for m in loaded} & {'torch', 'omegaconf', 'hydra'}, loaded"
    )
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-1000:]


@pytest.mark.parametrize("preset,block", [("small", "standard"), ("gau", "gau")])
def test_the_block_is_a_group_and_model_gau_a_preset_of_it(make_config, preset, block):
    cfg = make_config([f"model={preset}"])
    assert cfg.block.name == block
    assert make_config(["block=gau"]).norm.name == "softmax", "block=gau alone keeps the norm"


def test_scoring_more_probe_positions_than_the_model_predicts_is_one_sentence():
    from attnlab.config.groups import ARCHITECTURE
    from attnlab.config.options import variant
    from attnlab.tasks.probe.data import ProbeDataModule
    from attnlab.tasks.probe.system import TaggerSystem

    architecture = {
        "model": variant("model", "tiny"), "block": variant("block", "standard"),
        "pe": variant("pe", "learned"), "norm": variant("norm", "softmax"),
        "synthesizer": variant("synthesizer", "dot"),
    }  # fmt: skip
    assert set(architecture) == set(ARCHITECTURE)
    system = TaggerSystem(
        Architecture.from_config(architecture), OPTIM, ProbeDataModule.vocab_size, num_classes=16,
        causal=False,
    )  # fmt: skip
    system.check_lengths(task_data("probe", max_len=16, eval_max_len=16))
    with pytest.raises(
        ConfigError, match=r"positions up to 32 but the model predicts positions 1\.\.16"
    ):
        system.check_lengths(task_data("probe", max_len=16, eval_max_len=32))


@pytest.mark.slow
@pytest.mark.parametrize("group", COMPOSED_ALONE)
def test_a_variant_composed_alone_is_the_node_a_run_gets(group, tmp_path):
    for option in options(group):
        assert variant(group, option) == to_dict(
            compose_config([f"{group}={option}"], tmp_path)[group]
        )


def test_the_model_settings_python_falls_back_on_are_the_yamls():
    """ModelConfig's defaults (for networks built in code: tests, benchmarks) are those of
    conf/model/small.yaml, cross-attention's parts included: no second set of defaults."""
    from dataclasses import MISSING, fields

    from attnlab.config.options import variant
    from attnlab.model.architecture import ModelConfig

    yaml = variant("model", "small")
    defaults = {
        f.name: f.default if f.default_factory is MISSING else f.default_factory()
        for f in fields(ModelConfig)
        if f.name != "block"
    }
    assert defaults == {name: yaml[name] for name in defaults}


def targets(node: object, where: str) -> list[tuple[str, dict]]:
    """Every node under `node` that names an attnlab class, with where it sits."""
    if not isinstance(node, dict):
        return []
    found = [(where, node)] if str(node.get("_target_", "")).startswith("attnlab.") else []
    for key, child in node.items():
        found += targets(child, f"{where}.{key}")
    return found


def yaml_nodes() -> list[tuple[str, dict]]:
    """The attnlab nodes of every YAML under conf/, as written (interpolations unresolved)."""
    from omegaconf import OmegaConf

    from attnlab.config.options import CONF_DIR

    found = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        written = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        found += targets(written, str(path.relative_to(CONF_DIR)))
    return found


def test_a_class_recorded_under_the_module_it_had_before_the_task_packages_is_found():
    """`MOVED` maps each recorded path to today's class, and only paths that no longer
    resolve on their own (an entry must never shadow a live module)."""
    from attnlab.config.build import MOVED, _locate, current, own_class

    assert len(MOVED) == 16, "lm 2, synthetic 2 and its 7 tasks, probe 2, seq2seq 3"
    for old, new in MOVED.items():
        assert current(old) == new and own_class(old) is own_class(new)
        with pytest.raises((ImportError, AttributeError)):
            _locate(old)
    assert current("attnlab.pe.rope.RoPE") == "attnlab.pe.rope.RoPE"


def test_defaults_live_in_the_yaml_alone():
    """No class of attnlab's repeats, as a Python default, a value its YAML sets: the two
    would drift. (A class that keeps a library's constructor keeps the library's defaults.)"""
    import inspect

    from attnlab.config.build import own_class

    nodes = [(where, node, own_class(node["_target_"])) for where, node in yaml_nodes()]
    assert len(nodes) > 60, "the walk finds the variants, tasks, systems and callbacks"
    repeated = [
        f"{where}.{key} ({node['_target_']})"
        for where, node, cls in nodes
        if next(c for c in cls.__mro__ if "__init__" in vars(c)).__module__.startswith("attnlab.")
        for key, parameter in inspect.signature(cls).parameters.items()
        if key in node and parameter.default is not inspect.Parameter.empty
    ]
    assert not repeated, f"Python defaults beside the YAML's: {repeated}"
