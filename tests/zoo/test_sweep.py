"""The sweep's machinery: its classification of outcomes, resuming, the time limit, the table."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from bench.zoo import __main__ as zoo  # noqa: E402
from bench.zoo import check_torch, report  # noqa: E402
from bench.zoo.outcome import Outcome, Status  # noqa: E402


def _mlp(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def _case(model: torch.nn.Module) -> check_torch.TorchCase:
    calls = (((torch.randn(1, 4),), {}), ((torch.randn(3, 4),), {}))
    return check_torch.TorchCase("test", "mlp", model.eval(), calls)


def test_a_model_equal_to_eager_is_bitwise() -> None:
    outcome = check_torch.run_case(lambda: _case(_mlp(0)), "test", "mlp")
    assert outcome.status is Status.BITWISE, outcome.detail
    assert outcome.points >= 3 and outcome.traces <= 2 and outcome.tier


def test_a_value_unequal_to_eager_is_classified_wrong() -> None:
    # Eager values of another model stand for a capture that silently differs.
    case, other = _case(_mlp(0)), _case(_mlp(1))
    expected = [check_torch._eager(other.model, call) for call in case.calls]
    outcome = check_torch.check(case, expected)
    assert outcome.status is Status.WRONG
    assert outcome.detail.startswith("call 0: output 0 differs from eager")


class ExportBranch(torch.nn.Module):
    """A model whose own code computes otherwise under torch.export (lara_mini's triangular
    solve by forward substitution): ``shift`` 0 sums in another order, 1 is off by one."""

    def __init__(self, shift: float) -> None:
        super().__init__()
        self.shift = shift
        self.fc = torch.nn.Linear(4, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc(x) if x.shape[0] > 0 else x  # a shape branch: torch.export's tier
        if torch.compiler.is_exporting():
            return y.flip(-1).cumsum(-1)[..., -1:] + self.shift
        return y.sum(-1, keepdim=True)


def test_the_models_own_export_branch_is_a_stated_tolerance() -> None:
    torch.manual_seed(0)
    case = _case(ExportBranch(0.0))
    x = case.calls[0][0][0]
    y = case.model.fc(x)
    assert not torch.equal(y.flip(-1).cumsum(-1)[..., -1:], y.sum(-1, keepdim=True))
    outcome = check_torch.run_case(lambda: case, "test", "export-branch")
    assert outcome.status is Status.TOLERANCE, outcome.detail
    assert outcome.tier == "torch.export"
    assert "bitwise equal to eager taking that branch" in outcome.detail


def test_an_export_branch_beyond_the_tolerance_is_wrong() -> None:
    torch.manual_seed(0)
    outcome = check_torch.run_case(lambda: _case(ExportBranch(1.0)), "test", "export-branch")
    assert outcome.status is Status.WRONG, outcome.detail


def test_the_dynamic_tier_may_trace_each_region_twice() -> None:
    # Two regions (around the graph break) per shape: more than 2 traces, 2 per region.
    from tests.torch.dynamic_models import IfMean

    torch.manual_seed(0)
    calls = (((torch.randn(2, 6),), {}), ((torch.randn(3, 6),), {}))
    case = check_torch.TorchCase("test", "if-mean", IfMean().eval(), calls)
    with pytest.warns(UserWarning, match="TorchDynamo"):
        outcome = check_torch.run_case(lambda: case, "test", "if-mean")
    assert outcome.status is Status.BITWISE, outcome.detail
    assert outcome.tier == "torch.dynamo" and outcome.traces > 2


def test_a_model_that_does_not_build_is_no_tiny_model_with_the_reason() -> None:
    def build() -> check_torch.TorchCase:
        raise ValueError("hidden_size must divide num_heads")

    outcome = check_torch.run_case(build, "test", "broken")
    assert outcome.status is Status.NO_TINY and "hidden_size" in outcome.detail
    assert not outcome.status.counts_as_supported


def test_a_rerun_skips_the_models_already_swept(tmp_path: Path) -> None:
    results, doc = tmp_path / "results.jsonl", tmp_path / "models.md"
    done = Outcome("jax", "eqx-mlp", "equinox", Status.BITWISE, "jax", 12, 1)
    results.write_text(json.dumps(done.to_json()) + "\n")
    argv = ["--only", "jax", "-k", "eqx-mlp", "--results", str(results), "--doc", str(doc)]
    assert zoo.main(argv) == 0  # nothing to run: no worker starts
    assert results.read_text().count("\n") == 1
    assert "| jax | 1 | 1 | 1 (100%) |" in doc.read_text()


def test_a_worker_past_its_time_limit_is_a_timeout() -> None:
    outcome = zoo.run_worker("jax:eqx-mlp", timeout=0.5)  # the interpreter alone takes longer
    assert outcome.status is Status.TIMEOUT and outcome.name == "eqx-mlp"


def test_a_worker_past_its_cpu_limit_is_a_timeout() -> None:
    # A CPU-time limit holds under any load: importing JAX alone takes more than 1 s of CPU.
    outcome = zoo.run_worker("jax:eqx-mlp", timeout=300, cpu=1)
    assert outcome.status is Status.TIMEOUT and outcome.detail == "over 1 s of CPU"


def test_a_worker_the_kernel_killed_is_over_the_machines_memory() -> None:
    outcome = zoo.exit_outcome("timm", "big_vit", -signal.SIGKILL, 90.0, "")
    assert outcome.status is Status.TIMEOUT and "memory" in outcome.detail
    crash = zoo.exit_outcome("timm", "big_vit", -signal.SIGSEGV, None, "a\nb\nSegfault")
    assert crash.status is Status.FAILED and "Segfault" in crash.detail


def test_the_table_counts_each_family_and_lists_what_fails() -> None:
    outcomes = [
        Outcome("timm", "a", "A", Status.BITWISE, "torch.fx", 10, 1),
        Outcome("timm", "b", "B", Status.WRONG, "torch.export", 5, 2, detail="call 0: x"),
        Outcome("timm", "c", "C", Status.NO_TINY, detail="needs 224 pixels"),
        Outcome("jax", "d", "equinox", Status.TOLERANCE, "jax", 3, 2, detail="max 1e-7"),
    ]
    text = report.render(outcomes)
    assert "| timm | 3 | 2 | 1 (50%) | 98% | 1 | 0 | 0 | 1 | 0 | 0 | 1 |" in text
    assert "| jax | 1 | 1 | 1 (100%) | 100% | 0 | 1 |" in text
    assert "- **wrong** timm `b`: call 0: x" in text
    assert "| `c` | C |  |  |  |  | no tiny model | needs 224 pixels |" in text
