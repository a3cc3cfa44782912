// The staged ring over an emulated device, compiled by nvcc.
#include "../unit/test_staged_ring.cpp"
