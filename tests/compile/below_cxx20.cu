// Must NOT compile under nvcc without -std=c++20 (nvcc defaults to C++17): herd has to
// stop at its own #error naming the flag, before any construct C++17 cannot parse.

#include <herd/herd.hpp>

int main() {}
