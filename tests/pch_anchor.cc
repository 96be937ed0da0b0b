// The object of prl_test_pch (tests/CMakeLists.txt): the precompiled header is its product.
namespace prl::testing {
int PchAnchor() { return 0; }
}  // namespace prl::testing
