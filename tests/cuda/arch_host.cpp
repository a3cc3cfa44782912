// arch.cu's functions compiled by the host compiler without HERD_WITH_NCCL (plain herd::herd),
// beside arch_main.cpp, which has it.
#include "arch.cu"
