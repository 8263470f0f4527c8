// The base of the HDF5 wrapper (run_file/hdf5.hpp): the one lock every HDF5 call of the process
// takes, errors that name the file, and handles that close what they own even when a call throws.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <string_view>

namespace scape::run_file {

// Every failing HDF5 call (and every malformed file) surfaces as this, with the file path and
// the object or attribute in the message.
class H5Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// HDF5 serial is not thread-safe, so every HDF5 call of the process runs under this one lock.
// It is recursive because handle destructors (H5*close) run inside locked sections. Code that
// calls the C API directly while other threads may use HDF5 must hold it too. First use also
// turns off HDF5's own error-stack printing: failures are reported through H5Error instead.
std::recursive_mutex& hdf5_mutex();

// 'name' in single quotes, for error messages that name files, datasets and attributes.
std::string in_quotes(std::string_view s);
[[nodiscard]] std::unique_lock<std::recursive_mutex> lock_hdf5();

// Throws H5Error "HDF5 file '<file>': cannot <what>: <innermost HDF5 message>".
[[noreturn]] void throw_h5_error(std::string_view file, std::string_view what);
// Throws H5Error "HDF5 file '<file>': <problem>" for files that open but have the wrong shape.
[[noreturn]] void throw_invalid_file(std::string_view file, std::string_view problem);
// The innermost (most specific) description on HDF5's error stack, which is then cleared; the
// reason a failed call gives when the caller reports it itself.
std::string error_stack_detail();

// Whether an H5*close of this process failed (a full disk under a flush). HDF5 1.10 may then
// crash in its own clean-up at exit (H5F__close_cb, from its atexit handler), after the error
// was reported: a program that sees this true ends without it (apps/scape_main.cpp).
bool a_close_failed() noexcept;

// Owns one hid_t and releases it with the matching H5*close.
class Handle {
 public:
  using Closer = herr_t (*)(hid_t);
  Handle() = default;
  Handle(hid_t id, Closer closer) noexcept : id_(id), closer_(closer) {}
  Handle(Handle&& other) noexcept;
  Handle& operator=(Handle&& other) noexcept;
  Handle(const Handle&) = delete;
  Handle& operator=(const Handle&) = delete;
  ~Handle();

  hid_t get() const noexcept { return id_; }
  explicit operator bool() const noexcept { return id_ >= 0; }
  // Releases now; returns the H5*close status (destructors ignore it).
  herr_t close() noexcept;

 private:
  hid_t id_ = H5I_INVALID_HID;
  Closer closer_ = nullptr;
};

// The in-memory HDF5 type of T (float, double, std::int64_t, std::uint8_t).
template <typename T>
hid_t native_type();
template <>
hid_t native_type<float>();
template <>
hid_t native_type<double>();
template <>
hid_t native_type<std::int64_t>();
template <>
hid_t native_type<std::uint8_t>();

}  // namespace scape::run_file
