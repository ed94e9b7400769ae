"""ClusterSpec from flags, TF_CONFIG and Slurm; bad input raises ConfigError."""

import json

import pytest

import psclient


def test_from_flags():
    spec = psclient.ClusterSpec.from_flags("ps0:2222,ps1:2222", "w0:2222,w1:2222", "worker", 1)
    assert spec.ps_hosts == ["ps0:2222", "ps1:2222"]
    assert spec.worker_hosts == ["w0:2222", "w1:2222"]
    assert spec.worker_index == 1 and not spec.is_chief and spec.is_worker and not spec.is_ps
    assert spec.self_address == "w1:2222" and spec.num_ps == 2 and spec.num_workers == 2
    assert "worker:1" in str(spec)
    ps = psclient.ClusterSpec.from_flags("ps0:2222", "w0:2222", "ps", 0)
    assert ps.is_ps and ps.worker_index == -1


def test_from_tf_config_with_chief():
    tf_config = {"cluster": {"chief": ["c:1"], "worker": ["w0:1", "w1:1"], "ps": ["p:1"]},
                 "task": {"type": "worker", "index": 1}}
    spec = psclient.ClusterSpec.from_tf_config(json.dumps(tf_config))
    assert spec.worker_hosts == ["c:1", "w0:1", "w1:1"]
    assert spec.worker_index == 2 and spec.task_index == 1 and spec.job_name == "worker"
    env_spec = psclient.ClusterSpec.from_environment({"TF_CONFIG": json.dumps(tf_config)})
    assert env_spec == spec


def test_from_slurm():
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "node[01-02]",
           "SLURM_TASKS_PER_NODE": "2(x2)"}
    spec = psclient.ClusterSpec.from_slurm(env, num_ps=1, port_base=3000)
    assert spec.ps_hosts == ["node01:3000"]
    assert spec.worker_hosts == ["node01:3001", "node02:3000", "node02:3001"]
    assert spec.worker_index == 1 and spec.self_address == "node02:3000" and spec.local_gpu == 0
    assert psclient.ClusterSpec.from_environment(env, num_ps=1, port_base=3000) == spec


@pytest.mark.parametrize("make", [
    lambda: psclient.ClusterSpec.from_flags("", "w:1", "worker", 0),
    lambda: psclient.ClusterSpec.from_flags("p:1", "w:1", "worker", 5),
    lambda: psclient.ClusterSpec.from_flags("p:99999", "w:1", "worker", 0),
    lambda: psclient.ClusterSpec.from_tf_config("{not json"),
    lambda: psclient.ClusterSpec.from_environment({}),
])
def test_bad_input_raises_config_error(make):
    with pytest.raises(psclient.ConfigError):
        make()
