// Token data for the GPT model: byte-level text, nanoGPT and llm.c token shards, a seeded Markov
// corpus with an exact entropy rate, and the deterministic per-worker batch sampler
// (formats: karpathy/nanoGPT data/*/prepare.py, karpathy/llm.c dev/data/data_common.py).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

namespace scape::model {

// Any problem with a data file; what() names the file and the problem.
class DataError : public std::runtime_error {
 public:
  DataError(const std::string& path, const std::string& problem);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

using Tokens = std::vector<std::uint16_t>;

struct TokenSplit {
  Tokens train;
  Tokens val;
  int vocab_size = 0;
};

// The first floor(n (1 - val_fraction)) tokens train, the rest validate (nanoGPT's split).
// Throws std::invalid_argument unless 0 <= val_fraction < 1.
TokenSplit split_tokens(const Tokens& tokens, double val_fraction, int vocab_size);

// Raw text read as bytes: vocab_size 256.
TokenSplit load_text_bytes(const std::string& path, double val_fraction);

// kNanoGpt: the file is nothing but little-endian uint16 tokens.
// kLlmc: 256 int32 header {magic 20240520, version 1, token count, 0...} then uint16 tokens.
enum class TokenFormat { kNanoGpt, kLlmc };
inline constexpr std::int32_t kLlmcMagic = 20240520;
inline constexpr std::int32_t kLlmcVersion = 1;
inline constexpr std::size_t kLlmcHeaderInts = 256;

// Throws DataError for a missing file, a directory, an empty file, a bad llm.c header, a size
// that does not match the token count, or a token >= vocab_size.
Tokens read_tokens(const std::string& path, TokenFormat format, int vocab_size);
void write_tokens(const std::string& path, std::span<const std::uint16_t> tokens, TokenFormat format);

// Order-1 Markov source: from each state, `concentration` of the mass goes to `successors`
// seeded tokens (with seeded unequal weights) and the rest is uniform over the vocabulary.
// The uniform floor makes the chain ergodic, so the stationary law and entropy rate exist.
struct MarkovConfig {
  int vocab_size = 64;
  int successors = 4;
  double concentration = 0.9;
  std::uint64_t seed = 1;

  // Throws std::invalid_argument naming the field.
  void validate() const;
};

class MarkovSource {
 public:
  explicit MarkovSource(const MarkovConfig& cfg);

  int vocab_size() const { return cfg_.vocab_size; }
  // P(from, to); throws std::out_of_range outside [0, vocab_size).
  double probability(int from, int to) const;
  // Stationary distribution by power iteration in double.
  const std::vector<double>& stationary() const { return stationary_; }
  // H = sum_s pi(s) H(P(s, .)) in nats per token: the floor of any next-token loss.
  double entropy_rate() const { return entropy_rate_; }
  // n tokens of the chain; a pure function of (seed, stream, n).
  Tokens generate(std::size_t n, std::uint64_t stream) const;

 private:
  int next(int state, std::uint64_t h) const;

  MarkovConfig cfg_;
  std::vector<int> succ_;         // [vocab, successors] successor tokens per state
  std::vector<double> succ_p_;    // their extra mass (sums to concentration per state)
  std::vector<double> stationary_;
  double entropy_rate_ = 0;
};

// A generated corpus of n_tokens split like text.
TokenSplit synthetic_corpus(const MarkovConfig& cfg, std::size_t n_tokens, double val_fraction);

enum class Split : std::uint64_t { kTrain = 0, kVal = 1 };

// Random windows of T+1 tokens: the global batch at `step` is G sequences whose start offsets
// are a counter-based hash of (seed, split, step, g), so any worker computes its own share with
// no shared generator. Worker `rank` of W takes g in [rank G/W, (rank+1) G/W): the global batch
// is the same whatever W divides it. Keeps a view of the tokens: they must outlive the sampler.
class BatchSampler {
 public:
  // Throws std::invalid_argument when tokens has fewer than T+1 tokens.
  BatchSampler(std::span<const std::uint16_t> tokens, int seq_len, std::uint64_t seed, Split split);

  int seq_len() const { return seq_len_; }
  std::size_t offset(std::uint64_t step, std::uint64_t g) const;
  // inputs/targets of one sequence: tokens[o, o+T) and tokens[o+1, o+T].
  void sequence(std::uint64_t step, std::uint64_t g, std::span<std::int32_t> inputs,
                std::span<std::int32_t> targets) const;
  // Fills [G/W, T] row-major inputs/targets for worker `rank`. Throws std::invalid_argument when
  // W does not divide G, rank is out of range, or the spans are not G/W * T long.
  void worker_batch(std::uint64_t step, int global_batch, int workers, int rank, std::span<std::int32_t> inputs,
                    std::span<std::int32_t> targets) const;

 private:
  std::span<const std::uint16_t> tokens_;
  int seq_len_;
  std::uint64_t seed_;
  Split split_;
};

}  // namespace scape::model
