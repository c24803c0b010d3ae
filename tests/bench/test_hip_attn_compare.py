"""The hip-attn suite (bench/suites/hip_attn_loader.py): our preset -> hip-attn argument mapping, and the stub-on-missing-import loader (on a fake
hip_attn package, so no hip-attn install is needed)."""

from __future__ import annotations

import sys
import textwrap

import pytest

from bench.suites import hip_attn_loader as hc
from infinitehip.attention.methods.infinitehip.config import PRESETS


def test_mapping_of_default_preset():
    m = hc.hip_mapping(PRESETS["wide-final"], "late", (4, 4, 1))  # the paper's last-stage budget
    # hip's stage i scores the tokens the previous stage kept (stage_k); second_stage_k is the last stage's keep
    assert [(s["stage_chunk_size"], s["stage_k"], s["stage_block_stride_q"]) for s in m["stages"]] == [
        (256, None, 4), (32, 32768, 4), (16, 8192, 1)]
    assert all(s["stage_block_size_q"] == 64 and s["stage_stride"] == 1 for s in m["stages"])
    assert (m["sink_token_size"], m["sliding_window_size"], m["second_stage_k"]) == (256, 1024, 2048)
    assert (m["scan_extend_backend"], m["sa_extend_backend"], m["using_landmark"]) == ("relative", "streaming", True)
    assert m["mask_refresh_interval"] == [96, 24, 8]
    early = hc.hip_mapping(PRESETS["3k-fast"], "early", (1, 1, 1))
    assert (early["second_stage_k"], early["scan_extend_backend"]) == (4096, "streaming")
    assert [s["stage_chunk_size"] for s in early["stages"]] == [256, 32, 8]
    assert early["mask_refresh_interval"] == [32, 16, 8]


def _fake_hip(root, args_fields):
    pkg = root / "hip_attn"
    (pkg / "v1_2").mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise RuntimeError('the top-level __init__ must not run')\n")
    (pkg / "v1_2" / "__init__.py").write_text("raise RuntimeError('the v1_2 __init__ must not run')\n")
    (pkg / "v1_2" / "attention_metadata.py").write_text(textwrap.dedent(f"""
        import dataclasses
        HiPAttentionArgs = dataclasses.make_dataclass("HiPAttentionArgs", [(n, object, None) for n in {args_fields!r}])
        ScanStage = dataclasses.make_dataclass("ScanStage", [(n, object, None) for n in {hc.STAGE_NAMES!r}])
        HiPAttentionOutputMetadata = dataclasses.make_dataclass("M", [(n, object, None) for n in {hc.META_NAMES!r}])
    """))
    (pkg / "v1_2" / "hip_config.py").write_text(
        "import dataclasses\n@dataclasses.dataclass\nclass HiPAttentionConfig:\n    mask_refresh_interval: list = None\n")
    (pkg / "v1_2" / "mask_refresh_interval.py").write_text(
        "class HiPMaskRefreshState:\n    def __init__(self, hip_config):\n        pass\n    def update(self):\n        pass\n")
    (pkg / "v1_2" / "attention_extend.py").write_text(textwrap.dedent("""
        import hipcmp_missing_mod.sub as T  # missing: stubbed, with its submodule
        from hipcmp_missing_mod import annotate

        class Uses(T.Base):  # a stub as base class
            pass

        with annotate("at import"):  # a stub as context manager
            pass

        @annotate("range")  # a stub decorator factory must return the function itself
        def dual_stage_quadratic_hip_attention(q, k, v, args, cached_metadata=None):
            return ("called", q)
    """))


@pytest.mark.parametrize("complete", [True, False])
def test_import_stubs_missing_modules_and_checks_signatures(tmp_path, complete):
    _fake_hip(tmp_path, hc.ARG_NAMES if complete else hc.ARG_NAMES[1:])
    try:
        if not complete:
            with pytest.raises(TypeError, match=hc.ARG_NAMES[0]):
                hc.import_hip(str(tmp_path))
            return
        api, info = hc.import_hip(str(tmp_path))
        assert info["stubbed"] == ["hipcmp_missing_mod", "hipcmp_missing_mod.sub"]
        assert api.attention(q=1, k=None, v=None, args=None) == ("called", 1)
        assert info["signatures"]["HiPAttentionArgs"] == sorted(hc.ARG_NAMES)
    finally:
        for name in [m for m in sys.modules if m.split(".")[0] in ("hip_attn", "hipcmp_missing_mod")]:
            del sys.modules[name]
