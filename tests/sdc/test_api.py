"""The public API's single-process parts: exports, Schedule, deterministic mode, replay."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import gpu_monitor.sdc as sdc
from gpu_monitor.sdc import Schedule, deterministic_mode
from gpu_monitor.sdc.hooks import cublas_config_problem
from gpu_monitor.sdc.replay import replay, result_row


def test_the_issue_names_are_exported():
    for name in ("fingerprints", "attach", "Schedule", "train", "find_divergent_ranks",
                 "check_topology", "rank_map", "write_report"):
        assert callable(getattr(sdc, name)), name
    with pytest.raises(AttributeError):
        sdc.no_such_name  # noqa: B018


def test_schedule_defaults_are_the_issues():
    s = Schedule()
    assert (s.audit_every, s.deterministic_audits, s.check_every, s.ckpt_every, s.peer_offset,
            s.check_on_checkpoint, s.max_grad_norm) == (10, True, 10, 100, 8, True, 1.0)


def test_schedule_selects_the_last_step_of_each_interval():
    s = Schedule(audit_every=10, check_every=5, ckpt_every=20, deterministic_audits=False)
    assert [x for x in range(40) if s.is_audit(x)] == [9, 19, 29, 39]
    assert not any(s.is_deterministic_audit(x) for x in range(40))
    assert [x for x in range(40) if s.is_checkpoint(x)] == [19, 39]
    assert [x for x in range(20) if s.is_weight_check(x)] == [4, 9, 14, 19]


def test_checkpoints_force_a_weight_check_unless_disabled():
    forced = Schedule(check_every=0, ckpt_every=7)
    assert [x for x in range(21) if forced.is_weight_check(x)] == [6, 13, 20]
    off = Schedule(check_every=0, ckpt_every=7, check_on_checkpoint=False)
    assert not any(off.is_weight_check(x) for x in range(21))


def test_zero_disables_a_check():
    s = Schedule(audit_every=0, check_every=0, ckpt_every=0)
    assert not any(s.is_audit(x) or s.is_weight_check(x) or s.is_checkpoint(x) for x in range(50))


@pytest.mark.parametrize(
    "kwargs, field",
    [({"audit_every": -1}, "audit_every"), ({"check_every": 2.5}, "check_every"),
     ({"peer_offset": 0}, "peer_offset"), ({"max_grad_norm": 0}, "max_grad_norm"),
     ({"ckpt_every": True}, "ckpt_every")],
)
def test_schedule_rejects_bad_values_naming_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Schedule(**kwargs)


@pytest.mark.parametrize("env, ok", [({}, False), ({"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}, True),
                                     ({"CUBLAS_WORKSPACE_CONFIG": ":16:8"}, True),
                                     ({"CUBLAS_WORKSPACE_CONFIG": ":0:0"}, False)])
def test_cublas_workspace_config_is_required_for_cuda(env, ok):
    problem = cublas_config_problem(env)
    assert (problem is None) == ok
    if not ok:
        assert "CUBLAS_WORKSPACE_CONFIG=:4096:8" in problem


def test_deterministic_mode_applies_inside_and_restores_the_callers_settings():
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    try:
        with deterministic_mode(True):
            assert torch.are_deterministic_algorithms_enabled()
            assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
            assert not torch.backends.cuda.flash_sdp_enabled()
            assert torch.backends.cuda.math_sdp_enabled()
        assert not torch.are_deterministic_algorithms_enabled()
        assert torch.backends.cudnn.benchmark and torch.backends.cuda.flash_sdp_enabled()
        with pytest.raises(KeyError), deterministic_mode(True):
            raise KeyError("restored on errors too")
        assert not torch.are_deterministic_algorithms_enabled()
        with deterministic_mode(False):
            assert not torch.are_deterministic_algorithms_enabled()
    finally:
        torch.backends.cudnn.benchmark = False


class WithBuffer(nn.Module):
    """A forward that mutates a buffer and uses the RNG: replay must hide both from training."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.lin = nn.Linear(4, 3)
        self.spare = nn.Linear(3, 3)  # not used by forward
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return self.lin(x)


def loss_fn(model, batch):
    return model(batch).pow(2).mean()


def test_replay_restores_gradients_buffers_and_rng_and_reproduces_bits():
    m = WithBuffer()
    params = list(m.parameters())
    batch = torch.arange(8, dtype=torch.float32).reshape(2, 4) / 8
    loss = loss_fn(m, batch)
    loss.backward()
    own_grads = [None if p.grad is None else p.grad.clone() for p in params]
    grad_objects = [p.grad for p in params]
    calls = m.calls.clone()
    torch.manual_seed(5)
    rng = torch.get_rng_state()

    row = replay(m, loss_fn, batch, params=params, with_grads=True)

    assert [p.grad for p in params] == grad_objects  # the same tensor objects are back
    assert all(g is None or torch.equal(p.grad, g) for p, g in zip(params, own_grads, strict=True))
    assert torch.equal(m.calls, calls)
    assert torch.equal(torch.get_rng_state(), rng)
    fps = sdc.fingerprints([p.grad if p.grad is not None else torch.zeros_like(p) for p in params])
    assert torch.equal(row, result_row(loss, fps))  # same loss bits, same gradients
    assert torch.equal(replay(m, loss_fn, batch, params=params, with_grads=False)[:3], row[:3])
    assert replay(m, loss_fn, batch, params=params, with_grads=False)[3:].tolist() == [0, 0, 0]


def test_replay_of_different_data_gives_a_different_row():
    m = WithBuffer()
    params = list(m.parameters())
    a = torch.ones(2, 4)
    assert not torch.equal(replay(m, loss_fn, a, params=params, with_grads=True),
                           replay(m, loss_fn, a * 2, params=params, with_grads=True))
