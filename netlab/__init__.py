"""The netlab (docs/NETLAB.md): an emulated cluster network on one machine and the measured study
run over it. `netlab/netlab` is the shell driver (`scripts/netlab` forwards to it); the Python
modules here are the parts it runs: the torch runtime's node (`torch_bench`, `gloo_bench_comm`:
the venv with torch), the MPI runtime's runs and calibration (`mpi_bench`), the torch rows'
prediction (`torch_predict`), the strong-scaling plan and summary (`scaling`), the steps.csv
columns (`steps_csv`) and the tables and figures (`tables`); all but the torch ones run under
Debian's /usr/bin/python3 (h5py, numpy, matplotlib) with the repository root on PYTHONPATH."""
