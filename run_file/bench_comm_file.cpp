// The bench-comm file's writer (see bench_comm_file.hpp).
#include "run_file/bench_comm_file.hpp"

#include <utility>

#include "run_file/hdf5.hpp"

namespace scape::run_file {

void write_bench_comm_file(const std::filesystem::path& out, const std::string& backend,
                           const std::vector<BenchCommRow>& rows) {
  File f = File::create(out);
  f.write_string_attribute("format", kBenchCommFormat);
  f.write_string_attribute("backend", backend);
  std::vector<std::string> names, kinds, regimes;
  for (const auto& r : rows) {
    names.push_back(r.collective);
    kinds.push_back(r.kind);
    regimes.push_back(r.regime);
  }
  f.create_string_dataset("collective", names);
  f.create_string_dataset("kind", kinds);
  f.create_string_dataset("regime", regimes);
  const std::pair<const char*, double BenchCommRow::*> columns[] = {
      {"workers", &BenchCommRow::workers},
      {"payload_bytes", &BenchCommRow::payload_bytes},
      {"latency_steps", &BenchCommRow::latency_steps},
      {"bytes_sent_per_worker", &BenchCommRow::bytes_sent_per_worker},
      {"time_s", &BenchCommRow::time_s},
      {"algbw_GBps", &BenchCommRow::algbw_GBps},
      {"busbw_GBps", &BenchCommRow::busbw_GBps}};
  for (const auto& [name, field] : columns) {
    std::vector<double> v;
    for (const auto& r : rows) v.push_back(r.*field);
    const hsize_t n = v.size();
    f.create_dataset(name, H5T_IEEE_F64LE, DatasetShape{{n}, {}, {}, {}}).write<double>({0}, {n}, v);
  }
  f.close();
}

}  // namespace scape::run_file
