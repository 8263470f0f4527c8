// Token data readers, synthetic Markov corpus and per-worker batch sampler (see data.hpp for
// the file formats and the sampling rule).
#include "model/data.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <system_error>

#include "util/rng.hpp"

namespace scape::model {

static_assert(std::endian::native == std::endian::little, "token files are little-endian; add byte swaps here");

namespace {

namespace fs = std::filesystem;

// Purposes of the counter-based draws, so no two uses of one seed share a stream.
enum Purpose : std::uint64_t { kSuccessor = 1, kWeight, kStart, kTransition, kSampleOffset };

// Key of an ordered tuple of counters under `seed`: util/rng.hpp's derive, folded left.
std::uint64_t key(std::uint64_t seed, std::initializer_list<std::uint64_t> parts) {
  for (std::uint64_t part : parts) seed = rng::derive(seed, part);
  return seed;
}

// Opens a regular, non-empty file and returns its bytes.
std::vector<char> read_file_bytes(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) throw DataError(path, "no such file");
  if (fs::is_directory(st)) throw DataError(path, "is a directory, not a data file");
  if (!fs::is_regular_file(st)) throw DataError(path, "is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path, "cannot be opened for reading");
  in.seekg(0, std::ios::end);
  const std::streamoff size = in.tellg();
  if (size <= 0) throw DataError(path, "file is empty");
  std::vector<char> bytes(static_cast<std::size_t>(size));
  in.seekg(0);
  if (!in.read(bytes.data(), size)) throw DataError(path, "read failed");
  return bytes;
}

Tokens decode_uint16(const std::string& path, const char* data, std::size_t count, int vocab_size) {
  Tokens tokens(count);
  std::memcpy(tokens.data(), data, count * sizeof(std::uint16_t));
  for (std::size_t i = 0; i < count; ++i) {
    if (tokens[i] >= vocab_size) {
      throw DataError(path, "token " + std::to_string(tokens[i]) + " at index " + std::to_string(i) +
                                " is >= vocab_size " + std::to_string(vocab_size));
    }
  }
  return tokens;
}

Tokens read_llmc(const std::string& path, const std::vector<char>& bytes, int vocab_size) {
  constexpr std::size_t header_bytes = kLlmcHeaderInts * sizeof(std::int32_t);
  if (bytes.size() < header_bytes) {
    throw DataError(path, "truncated llm.c header: " + std::to_string(bytes.size()) + " bytes, the header alone is " +
                              std::to_string(header_bytes));
  }
  std::int32_t header[3];
  std::memcpy(header, bytes.data(), sizeof(header));
  if (header[0] != kLlmcMagic) {
    throw DataError(path, "bad magic " + std::to_string(header[0]) + " (expected " + std::to_string(kLlmcMagic) +
                              " for an llm.c token file)");
  }
  if (header[1] != kLlmcVersion) {
    throw DataError(path, "unsupported llm.c version " + std::to_string(header[1]) + " (expected 1: uint16 tokens)");
  }
  if (header[2] <= 0) throw DataError(path, "header declares " + std::to_string(header[2]) + " tokens");
  const auto count = static_cast<std::size_t>(header[2]);
  const std::size_t payload = bytes.size() - header_bytes;
  if (payload != count * sizeof(std::uint16_t)) {
    throw DataError(path, std::string(payload < count * 2 ? "truncated" : "size mismatch") + ": header declares " +
                              std::to_string(count) + " tokens (" + std::to_string(count * 2) + " bytes) but " +
                              std::to_string(payload) + " bytes follow the header");
  }
  return decode_uint16(path, bytes.data() + header_bytes, count, vocab_size);
}

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument(what);
}

}  // namespace

DataError::DataError(const std::string& path, const std::string& problem)
    : std::runtime_error("data file '" + path + "': " + problem), path_(path) {}

TokenSplit split_tokens(const Tokens& tokens, double val_fraction, int vocab_size) {
  require(val_fraction >= 0.0 && val_fraction < 1.0,
          "split_tokens: val_fraction = " + std::to_string(val_fraction) + " must be in [0, 1)");
  const auto n_train = static_cast<std::size_t>(static_cast<double>(tokens.size()) * (1.0 - val_fraction));
  const auto cut = tokens.begin() + static_cast<std::ptrdiff_t>(n_train);
  return TokenSplit{Tokens(tokens.begin(), cut), Tokens(cut, tokens.end()), vocab_size};
}

TokenSplit load_text_bytes(const std::string& path, double val_fraction) {
  const std::vector<char> bytes = read_file_bytes(path);
  Tokens tokens(bytes.size());
  std::transform(bytes.begin(), bytes.end(), tokens.begin(),
                 [](char c) { return static_cast<std::uint16_t>(static_cast<unsigned char>(c)); });
  return split_tokens(tokens, val_fraction, 256);
}

Tokens read_tokens(const std::string& path, TokenFormat format, int vocab_size) {
  const std::vector<char> bytes = read_file_bytes(path);
  if (format == TokenFormat::kLlmc) return read_llmc(path, bytes, vocab_size);
  if (bytes.size() % sizeof(std::uint16_t) != 0) {
    throw DataError(path, "truncated: " + std::to_string(bytes.size()) +
                              " bytes is not a whole number of uint16 tokens");
  }
  return decode_uint16(path, bytes.data(), bytes.size() / sizeof(std::uint16_t), vocab_size);
}

void write_tokens(const std::string& path, std::span<const std::uint16_t> tokens, TokenFormat format) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw DataError(path, "cannot be opened for writing");
  if (format == TokenFormat::kLlmc) {
    if (tokens.size() > static_cast<std::size_t>(std::numeric_limits<std::int32_t>::max())) {
      throw DataError(path, "too many tokens for an llm.c header");
    }
    std::int32_t header[kLlmcHeaderInts] = {};
    header[0] = kLlmcMagic;
    header[1] = kLlmcVersion;
    header[2] = static_cast<std::int32_t>(tokens.size());
    out.write(reinterpret_cast<const char*>(header), sizeof(header));
  }
  out.write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size_bytes()));
  if (!out) throw DataError(path, "write failed");
}

// ---- Markov source --------------------------------------------------------------------------

void MarkovConfig::validate() const {
  require(vocab_size >= 2 && vocab_size <= 65536,
          "MarkovConfig.vocab_size = " + std::to_string(vocab_size) + ": must be in [2, 65536]");
  require(successors >= 1 && successors <= vocab_size,
          "MarkovConfig.successors = " + std::to_string(successors) + ": must be in [1, vocab_size]");
  require(concentration >= 0.0 && concentration < 1.0,
          "MarkovConfig.concentration = " + std::to_string(concentration) + ": must be in [0, 1)");
}

MarkovSource::MarkovSource(const MarkovConfig& cfg) : cfg_(cfg) {
  cfg.validate();
  const int V = cfg.vocab_size, K = cfg.successors;
  const double floor = (1.0 - cfg.concentration) / V;
  succ_.resize(static_cast<std::size_t>(V) * K);
  succ_p_.resize(static_cast<std::size_t>(V) * K);
  for (int s = 0; s < V; ++s) {
    int* succ = succ_.data() + static_cast<std::size_t>(s) * K;
    double* p = succ_p_.data() + static_cast<std::size_t>(s) * K;
    const auto state = static_cast<std::uint64_t>(s);
    double total = 0;
    for (int j = 0; j < K; ++j) {
      const auto rank = static_cast<std::uint64_t>(j);
      // Distinct successors: probe forward from the hashed token past ones already taken.
      int t = static_cast<int>(key(cfg.seed, {kSuccessor, state, rank}) % static_cast<std::uint64_t>(V));
      while (std::find(succ, succ + j, t) != succ + j) t = (t + 1) % V;
      succ[j] = t;
      // Weights in [1, 4): unequal, so the row is not just uniform over its successors.
      p[j] = 1.0 + 3.0 * rng::uniform(key(cfg.seed, {kWeight, state}), rank);
      total += p[j];
    }
    for (int j = 0; j < K; ++j) p[j] *= cfg.concentration / total;
  }

  // Power iteration pi <- pi P; P = floor * ones + sparse successor mass, so each sweep is O(V K).
  // The uniform floor bounds the second eigenvalue by `concentration`, which sets convergence.
  std::vector<double> pi(static_cast<std::size_t>(V), 1.0 / V), next(static_cast<std::size_t>(V));
  for (int iter = 0; iter < 100000; ++iter) {
    std::fill(next.begin(), next.end(), floor);  // sum_s pi(s) * floor, with sum pi = 1
    for (int s = 0; s < V; ++s) {
      for (int j = 0; j < K; ++j) {
        const auto i = static_cast<std::size_t>(s) * K + static_cast<std::size_t>(j);
        next[static_cast<std::size_t>(succ_[i])] += pi[static_cast<std::size_t>(s)] * succ_p_[i];
      }
    }
    double sum = 0, change = 0;
    for (double x : next) sum += x;
    for (std::size_t t = 0; t < next.size(); ++t) {
      next[t] /= sum;
      change += std::abs(next[t] - pi[t]);
    }
    pi.swap(next);
    if (change < 1e-15) break;
  }
  stationary_ = std::move(pi);

  entropy_rate_ = 0;
  for (int s = 0; s < V; ++s) {
    double h = 0;
    for (int j = 0; j < K; ++j) {
      const double q = floor + succ_p_[static_cast<std::size_t>(s) * K + static_cast<std::size_t>(j)];
      h -= q * std::log(q);
    }
    if (floor > 0) h -= (V - K) * floor * std::log(floor);  // the V - K tokens with only the floor
    entropy_rate_ += stationary_[static_cast<std::size_t>(s)] * h;
  }
}

double MarkovSource::probability(int from, int to) const {
  if (from < 0 || from >= cfg_.vocab_size || to < 0 || to >= cfg_.vocab_size) {
    throw std::out_of_range("MarkovSource::probability: state " + std::to_string(from) + " -> " + std::to_string(to) +
                            " outside [0, " + std::to_string(cfg_.vocab_size) + ")");
  }
  const int K = cfg_.successors;
  double p = (1.0 - cfg_.concentration) / cfg_.vocab_size;
  for (int j = 0; j < K; ++j) {
    const auto i = static_cast<std::size_t>(from) * K + static_cast<std::size_t>(j);
    if (succ_[i] == to) p += succ_p_[i];
  }
  return p;
}

// One transition from `state` driven by the hashed counter h: the mixture "uniform with
// probability 1 - concentration, else a weighted successor" is exactly P(state, .).
int MarkovSource::next(int state, std::uint64_t h) const {
  const double u = rng::uniform(h, 0);
  const int K = cfg_.successors;
  const double* p = succ_p_.data() + static_cast<std::size_t>(state) * K;
  double acc = 0;
  for (int j = 0; j < K; ++j) {
    acc += p[j];
    if (u < acc) return succ_[static_cast<std::size_t>(state) * K + static_cast<std::size_t>(j)];
  }
  return static_cast<int>(rng::derive(h, 1) % static_cast<std::uint64_t>(cfg_.vocab_size));
}

Tokens MarkovSource::generate(std::size_t n, std::uint64_t stream) const {
  Tokens out(n);
  if (n == 0) return out;
  int state = static_cast<int>(key(cfg_.seed, {kStart, stream}) % static_cast<std::uint64_t>(cfg_.vocab_size));
  const std::uint64_t steps = key(cfg_.seed, {kTransition, stream});
  for (std::size_t i = 0; i < n; ++i) {
    out[i] = static_cast<std::uint16_t>(state);
    state = next(state, rng::derive(steps, i));
  }
  return out;
}

TokenSplit synthetic_corpus(const MarkovConfig& cfg, std::size_t n_tokens, double val_fraction) {
  return split_tokens(MarkovSource(cfg).generate(n_tokens, 0), val_fraction, cfg.vocab_size);
}

// ---- batch sampler --------------------------------------------------------------------------

BatchSampler::BatchSampler(std::span<const std::uint16_t> tokens, int seq_len, std::uint64_t seed, Split split)
    : tokens_(tokens), seq_len_(seq_len), seed_(seed), split_(split) {
  require(seq_len >= 1, "BatchSampler: seq_len = " + std::to_string(seq_len) + " must be >= 1");
  require(tokens.size() > static_cast<std::size_t>(seq_len),
          "BatchSampler: " + std::to_string(tokens.size()) + " tokens cannot hold one sequence of seq_len + 1 = " +
              std::to_string(seq_len + 1));
}

std::size_t BatchSampler::offset(std::uint64_t step, std::uint64_t g) const {
  // n - T valid starts; the modulo bias is below 2^-40 for any corpus that fits in memory.
  const std::uint64_t starts = tokens_.size() - static_cast<std::size_t>(seq_len_);
  return static_cast<std::size_t>(key(seed_, {kSampleOffset, static_cast<std::uint64_t>(split_), step, g}) % starts);
}

void BatchSampler::sequence(std::uint64_t step, std::uint64_t g, std::span<std::int32_t> inputs,
                            std::span<std::int32_t> targets) const {
  const auto T = static_cast<std::size_t>(seq_len_);
  require(inputs.size() == T && targets.size() == T, "BatchSampler::sequence: spans must hold seq_len tokens");
  const std::uint16_t* src = tokens_.data() + offset(step, g);
  std::copy(src, src + T, inputs.begin());
  std::copy(src + 1, src + T + 1, targets.begin());
}

void BatchSampler::worker_batch(std::uint64_t step, int global_batch, int workers, int rank,
                                std::span<std::int32_t> inputs, std::span<std::int32_t> targets) const {
  require(workers >= 1 && global_batch >= 1 && global_batch % workers == 0,
          "BatchSampler::worker_batch: workers = " + std::to_string(workers) + " must divide global_batch = " +
              std::to_string(global_batch));
  require(rank >= 0 && rank < workers,
          "BatchSampler::worker_batch: rank " + std::to_string(rank) + " outside [0, " + std::to_string(workers) + ")");
  const auto B = static_cast<std::size_t>(global_batch / workers);
  const auto T = static_cast<std::size_t>(seq_len_);
  require(inputs.size() == B * T && targets.size() == B * T,
          "BatchSampler::worker_batch: spans must hold (global_batch / workers) * seq_len = " +
              std::to_string(B * T) + " tokens");
  for (std::size_t i = 0; i < B; ++i) {
    sequence(step, static_cast<std::uint64_t>(rank) * B + i, inputs.subspan(i * T, T), targets.subspan(i * T, T));
  }
}

}  // namespace scape::model
