"""megatron_map: the backend -> Megatron table drives flags and the A/B families."""
from moebench.core import megatron_map
from moebench.core.megatron_map import BACKENDS, MegatronBackend
from moebench.megatron import flags


def test_table_matches_megatron_values():
    assert list(BACKENDS) == ["alltoall", "deepep", "hybridep", "ncclep"]
    assert megatron_map.FLEX == ("deepep", "hybridep", "ncclep")
    assert megatron_map.megatron_name("mcore-hybridep") == "hybridep" and BACKENDS["deepep"].mcore == "mcore-deepep"
    fam = megatron_map.families()
    assert fam["raw"] == ("alltoall", {"deepep": "deepep", "hybridep": "hybridep", "ncclep": "ncclep"})
    assert fam["mcore"] == ("mcore-alltoall", {"mcore-deepep": "deepep", "mcore-hybridep": "hybridep"})


def test_a_new_candidate_is_a_row(monkeypatch):
    monkeypatch.setitem(BACKENDS, "newep", MegatronBackend("newep", "flex", "MoEFlexTokenDispatcher", "_NewManager",
                                                           default_sms="32", domain_env="NEWEP_DOMAIN"))
    f = flags.megatron_flags("mcore-newep", "0.19.2", num_sms=8, ranks_per_nvlink_domain=4)
    assert f.megatron_lm == ["--moe-token-dispatcher-type", "flex", "--moe-flex-dispatcher-backend", "newep",
                             "--moe-flex-dispatcher-num-sms", "8"]
    assert f.env == {"NEWEP_DOMAIN": "4"}
    assert megatron_map.families()["mcore"][1]["mcore-newep"] == "newep"
    assert "Megatron's default applies (32)" in " ".join(flags.megatron_flags("newep", "0.19.2").notes)
