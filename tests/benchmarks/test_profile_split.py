"""benchmarks/gpu/profile_split.py: a profiled step's kernels sorted into kinds, in ms a step, with the idle time
left over and the floors beside them."""

from __future__ import annotations

import json
import sys

from support import ROOT


def kernel(name: str, us: float, device_type: str = "CUDA") -> dict:
    return {"name": name, "count": 1, "device_type": device_type, "self_device_us": us, "device_us": us,
            "self_cpu_us": 0.0}  # fmt: skip


def test_kernels_are_split_by_kind_and_the_rest_of_the_wall_time_is_idle(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "gpu"))
    import profile_split

    events = [
        kernel("nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT", 6000),
        kernel("void cublasLt::splitKreduce_kernel<32, 16>", 300),
        kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16", 1500),
        kernel("triton_per_fused__to_copy_add_native_dropout_native_layer_norm_view_8", 2400),
        kernel("triton_poi_fused_gelu_gelu_backward_view_10", 900),
        kernel("triton_red_fused__log_softmax__log_softmax_backward_data_nll_loss_forward", 600),
        kernel("void at::native::multi_tensor_apply_kernel<FusedOptimizerTensorListMetadata>", 300),
        kernel("Memset (Device)", 30),
        kernel("Optimizer.step#AdamW.step", 900),  # an annotation spanning kernels already counted
        kernel("aten::mm", 6000, device_type="CPU"),  # the operator around a GEMM kernel
    ]
    results = tmp_path / "results"
    (results / "profile").mkdir(parents=True)
    (results / "profile" / "base_128_ours_sparse_bf16_compile.json").write_text(
        json.dumps({"steps": 3, "events": events})
    )
    steps, batch, length = 6, 256, 128
    tokens = steps * batch * length
    setting = {
        "preset": "base", "max_seq_length": length, "batch_size": batch, "padding_share": 0.0,
        "useful_flops_per_real_token": 5e8,
        "results": {"ours sparse bf16 compile": {"real_tokens": tokens, "seconds": steps * 0.005}},
    }  # fmt: skip
    run = {"machine": "NVIDIA H200; torch 2.11", "bf16_matmul_peak_tflops": 800.0, "settings": [setting]}
    (results / "profile_base_128.json").write_text(json.dumps(run))
    monkeypatch.setattr(sys, "argv", ["profile_split.py", str(results), "--out", str(tmp_path / "split.json")])
    profile_split.main()

    split = json.loads((tmp_path / "split.json").read_text())["split_ms"]["ours sparse bf16 compile"]
    assert split == {
        "attention": 0.5, "GEMM": 2.1, "MLM + NSP loss": 0.2, "LayerNorm + dropout + residual": 0.8, "GELU": 0.3,
        "optimizer": 0.1, "other": 0.01, "idle (launch gaps, host waits)": 0.99, "wall time": 5.0,
    }  # fmt: skip
    table = capsys.readouterr().out
    # the GEMM floor: 5e8 FLOPs a token x 32,768 tokens, less attention's, at 800 and at the data sheet's 989.4
    attention = 3 * 12 * 4 * 768 * batch * length**2
    gemm = 5e8 * batch * length - attention
    assert f"| GEMM | 2.1 | {1000 * gemm / 800e12:.1f} / {1000 * gemm / 989.4e12:.1f} |" in table
