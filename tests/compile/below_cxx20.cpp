// Must NOT compile: herd in a translation unit compiled for C++17 (nvcc's default mode) has to
// stop at herd's own #error naming the flag, before any construct C++17 cannot parse.

#include <herd/herd.hpp>

int main() {}
