// The lock, the errors built from HDF5's error stack, and handle ownership: what every other
// part of the wrapper stands on.
#include "run_file/hdf5_handle.hpp"

#include <atomic>
#include <utility>

namespace scape::run_file {

// Appended piecewise: GCC 12 warns falsely (-Wrestrict) on "'" + std::string(s) + "'".
std::string in_quotes(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

// The innermost (most specific) description on HDF5's error stack, which is then cleared.
std::string error_stack_detail() {
  std::string detail;
  const auto keep_last = [](unsigned, const H5E_error2_t* error, void* out) -> herr_t {
    if (error->desc != nullptr && error->desc[0] != '\0') *static_cast<std::string*>(out) = error->desc;
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, keep_last, &detail);
  H5Eclear2(H5E_DEFAULT);
  return detail;
}

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  // Library failures become H5Error, not text on stderr. Once per thread: the thread-safe HDF5
  // of Debian keeps an error stack, and its printing switch, per thread (a sweep's parallel
  // points open files on their own threads).
  thread_local const bool silenced = [] {
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
    return true;
  }();
  (void)silenced;
  return mutex;
}

std::unique_lock<std::recursive_mutex> lock_hdf5() { return std::unique_lock(hdf5_mutex()); }

void throw_h5_error(std::string_view file, std::string_view what) {
  std::string message = "HDF5 file " + in_quotes(file) + ": cannot " + std::string(what);
  const std::string detail = error_stack_detail();
  if (!detail.empty()) message += " (" + detail + ")";
  throw H5Error(message);
}

void throw_invalid_file(std::string_view file, std::string_view problem) {
  throw H5Error("HDF5 file " + in_quotes(file) + ": " + std::string(problem));
}

// ---------------------------------------------------------------------------------------------
// Handle

Handle::Handle(Handle&& other) noexcept
    : id_(std::exchange(other.id_, H5I_INVALID_HID)), closer_(std::exchange(other.closer_, nullptr)) {}

Handle& Handle::operator=(Handle&& other) noexcept {
  if (this != &other) {
    close();
    id_ = std::exchange(other.id_, H5I_INVALID_HID);
    closer_ = std::exchange(other.closer_, nullptr);
  }
  return *this;
}

Handle::~Handle() { close(); }

namespace {
std::atomic<bool> g_close_failed{false};
}  // namespace

bool a_close_failed() noexcept { return g_close_failed.load(); }

herr_t Handle::close() noexcept {
  if (id_ < 0 || closer_ == nullptr) return 0;
  const auto lock = lock_hdf5();
  const herr_t status = closer_(std::exchange(id_, H5I_INVALID_HID));
  if (status < 0) g_close_failed = true;
  return status;
}

template <>
hid_t native_type<float>() {
  const auto lock = lock_hdf5();
  return H5T_NATIVE_FLOAT;
}
template <>
hid_t native_type<double>() {
  const auto lock = lock_hdf5();
  return H5T_NATIVE_DOUBLE;
}
template <>
hid_t native_type<std::int64_t>() {
  const auto lock = lock_hdf5();
  return H5T_NATIVE_INT64;
}
template <>
hid_t native_type<std::uint8_t>() {
  const auto lock = lock_hdf5();
  return H5T_NATIVE_UINT8;
}

}  // namespace scape::run_file
