"""A device per client (issue 24, first increment): FedScale's device-capacity file loads, a malformed one
is refused naming the entry (or the line of a CSV), a drawn population is seeded, availability is
deterministic, and the params that ask for them are validated."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from pipeline.config import ConfigError, DevicesParams, parse_params
from pipeline.federation import devices as dev

# FedScale's format: {client id: {"computation": inference ms per sample, "communication": kbit/s}}, ids from 1
FEDSCALE = {1: {"computation": 30.0, "communication": 800.0},
            2: {"computation": np.float64(12.5), "communication": 16000},
            3: {"computation": 100, "communication": np.float32(250.0)}}


def write_pickle(path, table):
    path.write_bytes(pickle.dumps(table))
    return path


def test_a_fedscale_capacity_file_loads_in_its_units(tmp_path):
    entries = dev.load_trace(write_pickle(tmp_path / "client_device_capacity", {3: FEDSCALE[3], 1: FEDSCALE[1],
                                                                                2: FEDSCALE[2]}))
    assert [e.client_id for e in entries] == [1, 2, 3]  # by ascending id, whatever the file's order
    assert [e.computation_ms for e in entries] == [30.0, 12.5, 100.0]
    d = entries[0].device()
    # training a sample: 3 inference passes (FedScale's factor); a FedScale kilobit is 1,024 bits
    assert d.samples_per_s == pytest.approx(1000 / (3 * 30.0))
    assert d.up_bytes_per_s == d.down_bytes_per_s == pytest.approx(800 * 1024 / 8)


def test_a_csv_trace_loads_with_comments_and_blank_lines(tmp_path):
    path = tmp_path / "devices.csv"
    path.write_text("# my phones\nclient_id,computation,communication\n\n7, 20, 1000\n5,40,500\n")
    entries = dev.load_trace(path)
    assert [(e.client_id, e.computation_ms, e.communication_kbps) for e in entries] == [(5, 40.0, 500.0),
                                                                                         (7, 20.0, 1000.0)]


def test_a_short_trace_is_cycled_over_the_clients(tmp_path):
    path = write_pickle(tmp_path / "cap.pkl", {10: FEDSCALE[1], 20: FEDSCALE[2]})
    p = DevicesParams(enabled=True, trace=str(path))
    population = dev.population(p, 5, seed=0)
    speeds = [d.samples_per_s for d in population]
    assert speeds[0] == speeds[2] == speeds[4] == pytest.approx(1000 / 90)
    assert speeds[1] == speeds[3] == pytest.approx(1000 / 37.5)
    assert all(d.availability is None for d in population)


class Evil:
    def __reduce__(self):
        return (print, ("this must never run",))


MALFORMED = [
    ("missing communication", {1: FEDSCALE[1], 2: {"computation": 5.0}}, ["entry 1", "client id 2", "'communication'"]),
    ("negative computation", {1: FEDSCALE[1], 2: FEDSCALE[2], 3: {"computation": -1.0, "communication": 9.0}},
     ["entry 2", "client id 3", "computation = -1.0", "positive"]),
    ("zero bandwidth", {1: {"computation": 1.0, "communication": 0}}, ["entry 0", "communication = 0"]),
    ("text value", {1: FEDSCALE[1], 4: {"computation": "fast", "communication": 9.0}},
     ["entry 1", "client id 4", "computation = 'fast'"]),
    ("boolean value", {1: {"computation": True, "communication": 9.0}}, ["entry 0", "computation = True"]),
    ("not finite", {1: {"computation": float("nan"), "communication": 9.0}}, ["entry 0", "computation = nan"]),
    ("text client id", {1: FEDSCALE[1], "two": FEDSCALE[2]}, ["entry 1", "client id 'two'", "integer"]),
    ("entry not a dict", {1: FEDSCALE[1], 2: [5.0, 9.0]}, ["entry 1", "client id 2", "list"]),
    ("a list, not a dict", [FEDSCALE[1]], ["holds a list", "pickled dict"]),
    ("no client", {}, ["lists no client"]),
]


@pytest.mark.parametrize("table, fragments", [c[1:] for c in MALFORMED], ids=[c[0] for c in MALFORMED])
def test_a_malformed_capacity_file_is_refused_naming_the_entry(tmp_path, table, fragments):
    path = write_pickle(tmp_path / "client_device_capacity", table)
    with pytest.raises(ConfigError) as err:
        dev.load_trace(path)
    msg = str(err.value)
    assert "devices.trace" in msg and str(path) in msg, msg
    for fragment in fragments:
        assert fragment in msg, msg


def test_a_pickle_that_runs_code_or_is_not_a_pickle_is_refused(tmp_path, capsys):
    with pytest.raises(ConfigError, match="names builtins.print"):
        dev.load_trace(write_pickle(tmp_path / "evil.pkl", {1: Evil()}))
    assert "must never run" not in capsys.readouterr().out
    (tmp_path / "junk").write_bytes(b"not a pickle at all")
    with pytest.raises(ConfigError, match="is not a device-capacity file"):
        dev.load_trace(tmp_path / "junk")
    with pytest.raises(ConfigError, match="devices.trace = .*no such file"):
        dev.load_trace(tmp_path / "missing.pkl")


BAD_CSV = [
    ("bad number", "client_id,computation,communication\n1,10,100\n2,ten,100\n", ["line 3", "computation = 'ten'"]),
    ("zero", "client_id,computation,communication\n1,10,0\n", ["line 2", "communication = 0.0"]),
    ("duplicate id", "client_id,computation,communication\n1,10,100\n# note\n1,20,100\n", ["line 4", "line 2"]),
    ("field count", "client_id,computation,communication\n1,10\n", ["line 2", "2 fields"]),
    ("header", "id,computation,communication\n1,10,100\n", ["line 1", "client_id"]),
    ("client id", "client_id,computation,communication\nx,10,100\n", ["line 2", "client_id = 'x'"]),
]


@pytest.mark.parametrize("text, fragments", [c[1:] for c in BAD_CSV], ids=[c[0] for c in BAD_CSV])
def test_a_malformed_csv_trace_is_refused_naming_the_line(tmp_path, text, fragments):
    path = tmp_path / "devices.csv"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        dev.load_trace(path)
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


# ------------------------------------------------------------------------------------------ drawn populations

def _figures(population):
    return [(d.samples_per_s, d.up_bytes_per_s, d.down_bytes_per_s) for d in population]


def test_a_drawn_population_is_seeded_and_per_client():
    p = DevicesParams(enabled=True)
    first = _figures(dev.draw_population(p, 6, seed=3))
    assert first == _figures(dev.draw_population(p, 6, seed=3))  # the same seed: the same devices
    assert first != _figures(dev.draw_population(p, 6, seed=4))
    assert _figures(dev.draw_population(p, 9, seed=3))[:6] == first  # adding clients changes no existing device
    assert len(set(first)) == 6  # heterogeneous by default
    speeds = [s for s, _, _ in _figures(dev.draw_population(p, 2000, seed=0))]
    assert np.median(speeds) == pytest.approx(p.samples_per_s, rel=0.1)  # log-normal around the median
    assert np.std(np.log(speeds)) == pytest.approx(p.samples_per_s_sigma, rel=0.1)


def test_sigma_zero_draws_every_device_at_the_medians():
    p = DevicesParams(enabled=True, samples_per_s_sigma=0, bandwidth_sigma=0, up_mbps=2.0, down_mbps=8.0)
    assert set(_figures(dev.draw_population(p, 4, seed=0))) == {(100.0, 2e6 / 8, 8e6 / 8)}


def test_availability_alternates_and_is_the_same_whatever_is_asked_first():
    p = DevicesParams(enabled=True, online_mean_s=50.0, offline_mean_s=20.0)
    a = dev.draw_population(p, 3, seed=1)[2].availability
    b = dev.draw_population(p, 3, seed=1)[2].availability
    assert b.online_at(5000.0) == a.online_at(5000.0)  # b asked about the far future first
    for t in np.linspace(0, 5000, 400):
        assert a.online_at(t) == b.online_at(t)
        if a.online_at(t):
            assert a.online_until(t) > t and not a.online_at(a.online_until(t)) and a.next_online(t) == t
        else:
            assert a.online_until(t) == t and a.next_online(t) > t and a.online_at(a.next_online(t))
    online = np.mean([a.online_at(t) for t in np.linspace(0, 200000, 20000)])
    assert online == pytest.approx(50 / 70, abs=0.08)  # online a share on / (on + off) of the time
    assert dev.draw_population(DevicesParams(enabled=True), 1, 0)[0].online_until(1e9) == math.inf


# ------------------------------------------------------------------------------------------ params

def _with(raw, **sections):
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return raw


@pytest.mark.parametrize("sections, fragments", [
    ({"train": {"schedule": "async"}}, ["train.schedule = 'async'", "devices.enabled: true"]),
    ({"train": {"schedule": "deadline"}, "devices": {"enabled": True}},
     ["exactly one of train.deadline_s", "train.deadline_quantile", "set one of them"]),
    ({"train": {"schedule": "deadline", "deadline_s": 5.0, "deadline_quantile": 0.5}, "devices": {"enabled": True}},
     ["both are set"]),
    ({"train": {"deadline_s": 5.0}}, ["train.deadline_s = 5.0", "only when train.schedule is deadline"]),
    ({"train": {"schedule": "deadline", "deadline_s": 5.0}}, ["devices.enabled: true"]),
    ({"train": {"schedule": "deadline", "deadline_quantile": 1.5}, "devices": {"enabled": True}},
     ["train.deadline_quantile = 1.5", "less than or equal to 1"]),
    ({"train": {"schedule": "deadline", "deadline_s": 0}, "devices": {"enabled": True}},
     ["train.deadline_s = 0", "greater than 0"]),
    ({"devices": {"samples_per_s": 0}}, ["devices.samples_per_s = 0", "greater than 0"]),
    ({"devices": {"bandwidth_sigma": -1}}, ["devices.bandwidth_sigma = -1"]),
    ({"devices": {"reference_model": "vgg"}}, ["devices.reference_model = 'vgg'", "'resnet8'"]),
    ({"devices": {"tracee": "x.pkl"}}, ["devices.tracee", "unknown key", "trace"]),
])
def test_bad_clock_params_are_refused_naming_the_key(default_params_raw, sections, fragments):
    with pytest.raises(ConfigError) as err:
        parse_params(_with(default_params_raw, **sections), "my-params.yaml")
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_a_deadline_with_devices_is_accepted(default_params_raw):
    params = parse_params(_with(default_params_raw, train={"schedule": "deadline", "deadline_quantile": 0.8},
                                devices={"enabled": True}, fedcache={"consistency": "round"}))
    assert (params.train.schedule, params.train.deadline_quantile, params.devices.enabled) == ("deadline", 0.8, True)
