// Configure-time probe (cmake/isa.cmake): exits 0 when the build host runs x86-64-v3 code.
int main() { return __builtin_cpu_supports("x86-64-v3") ? 0 : 1; }
