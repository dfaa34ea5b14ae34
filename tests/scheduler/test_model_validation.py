import pytest

from scheduler.core import PodGroup, Request, Share


def test_fractional_request_for_several_gpus_is_refused():
    with pytest.raises(ValueError, match="whole GPUs"):
        Request("r", gpu_request=0.5, gpu_count=2)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"gpu_request": 0.0}, "gpu_request"),
        ({"gpu_request": 1.5}, "gpu_request"),
        ({"priority": 101}, "priority"),
        ({"gpu_limit": 0.2, "gpu_request": 0.5}, "gpu_limit"),
        ({"gpu_memory_mib": -1}, "gpu_memory_mib"),
        ({"gpu_count": -1}, "gpu_count"),
    ],
)
def test_invalid_request_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        Request("r", **kwargs)


def test_model_set_from_trace_syntax():
    assert Request("r", gpu_model="V100M16|V100M32").gpu_model == frozenset({"V100M16", "V100M32"})
    assert Request("r", gpu_model={"A100"}).gpu_model == frozenset({"A100"})
    assert Request("r", gpu_model="").gpu_model is None


def test_labels_accept_a_single_string():
    r = Request("r", affinity="train", anti_affinity=["x", ""])
    assert r.affinity == frozenset({"train"})
    assert r.anti_affinity == frozenset({"x"})


def test_gang_minimum_rounds_up():
    assert PodGroup("g", headcount=5, threshold=0.5).min_members == 3
    assert PodGroup("g", headcount=4, threshold=0.5).min_members == 2
    with pytest.raises(ValueError, match="threshold"):
        PodGroup("g", headcount=4, threshold=0)


def test_share_request_out_of_range_is_refused():
    with pytest.raises(ValueError, match="request"):
        Share("s", gpu_request=1.2)
