# The test map: every ctest test and the source folders it tests, as ctest LABELS, so that the
# tests of a file are found from its folder (`ctest -L optimizers/scape`; tests/README.md). One
# row a test: its name, then its labels. A label is a folder of the checkout, or `scape_step`:
# the tests of SCAPE's optimizer step, whichever property they check. tests/test_map.py (ctest
# `test_map`) fails when a tests/test_*.cpp has no row, a row no folder, or a label names a
# folder that does not exist. Rows of tests a build does not register (CUDA, MPI, NCCL, the
# Python package) are passed over there.
set(scape_test_map
    # core/: layout, schedules, the ledger, the communicator interface
    "test_layout_schedule core"
    "test_ledger core optimizers optimizers/scape optimizers/baselines scape_step"
    # kernels/
    "test_kernels_adam kernels"
    "test_kernels_bitmask kernels"
    "test_kernels_codec kernels"
    "test_kernels_compressors kernels optimizers/baselines"
    "test_kernels_model kernels model"
    "test_kernels_reduce kernels"
    "test_kernels_scape_pass kernels"
    "test_kernels_select kernels"
    "test_kernels_sign kernels"
    "test_cuda_kernels kernels"
    "test_cuda_passes kernels"
    "test_cuda_model_ops kernels model"
    # optimizers/scape/ and the SCAPE step
    "test_formulations optimizers/scape core scape_step"
    "test_invariants optimizers/scape core scape_step"
    "test_optimizer_behaviour optimizers optimizers/scape optimizers/baselines core scape_step"
    "test_mask_oracle optimizers/scape train core scape_step"
    "test_mask_codec optimizers/scape kernels scape_step"
    "test_fp8_payload optimizers/scape kernels scape_step"
    "test_reference optimizers/scape optimizers/baselines core scape_step"
    "test_reference_py optimizers/scape optimizers/baselines scape_step"
    "test_hierarchy optimizers core sim scape_step"
    "test_residual_offload optimizers/feedback optimizers/scape scape_step"
    "test_device_optimizer optimizers/scape optimizers/feedback kernels scape_step"
    # optimizers/baselines/
    "test_baselines optimizers/baselines"
    "test_local_sgd optimizers/baselines sim"
    # model/
    "test_model_data model"
    "test_model_gpt model"
    "test_model_gradcheck model"
    "test_model_llama model"
    "test_model_train model"
    "test_device_model model kernels"
    # config/
    "test_config_keys config optimizers"
    "test_compute_model config predict sim"
    "test_sweep config run_file"
    # predict/
    "test_predict_calibration predict"
    "test_predict_calibration_hierarchy predict optimizers"
    "test_predict_cli predict apps"
    "test_predict_gemm predict"
    "test_predict_hierarchy predict optimizers"
    "test_predict_link_load predict run_file"
    "test_predict_model predict"
    "test_predict_regime predict"
    "test_predict_tables predict"
    "test_predict_volume predict optimizers"
    # run_file/
    "test_recorder run_file"
    "test_trace run_file python"
    # train/ and sim/
    "test_run_metrics train run_file"
    "test_device_memory train optimizers"
    "test_stepped_simulator sim"
    "test_device_train sim train model"
    # apps/: the scape command end to end
    "test_harness apps train run_file sim"
    "test_harness_sweep apps train run_file sim"
    "test_hardening apps run_file train"
    "test_fuzz_regressions apps config run_file train fuzz"
    "test_run_guards apps run_file train"
    "test_cli_input apps config"
    "test_host_memory apps train"
    "test_sweep_concurrency apps run_file sim"
    "test_quickstart scripts predict"
    # runtime/ and the communicators (tests/runtime/)
    "test_comm sim core"
    "test_mpi_runs runtime"
    "test_mpi_diagnostics runtime"
    "mpi_collectives_w1 runtime"
    "mpi_collectives_w2 runtime"
    "mpi_collectives_w3 runtime"
    "mpi_collectives_w4 runtime"
    "nccl_collectives_w1 runtime"
    "nccl_collectives_w2 runtime"
    "nccl_scape_w1 runtime optimizers/scape scape_step"
    "nccl_single_errors runtime"
    "nccl_single_w1 runtime"
    "nccl_run_cli runtime apps"
    # Python: the analysis package, the netlab, the scape package
    "test_analysis_py analysis"
    "test_netlab_py netlab"
    "test_python_package python"
    "test_python_citizen python"
    "test_python_netlab python netlab"
    # The tree as a whole: the layer order (docs/ARCHITECTURE.md), its checker, this map
    "layers docs"
    "layers_check_detects tests"
    "test_map tests")

# Appends (LABELS is a list: labels set where a test is registered, such as
# not_under_sanitizers, stay) the map's labels to the tests registered in the calling directory.
function(scape_label_tests)
  foreach(row IN LISTS scape_test_map)
    separate_arguments(words UNIX_COMMAND "${row}")
    list(POP_FRONT words name)
    if(TEST ${name})
      set_property(TEST ${name} APPEND PROPERTY LABELS ${words})
    endif()
  endforeach()
endfunction()
