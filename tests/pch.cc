// The source of huddle_test_pch (tests/CMakeLists.txt): the target exists to build the
// precompiled header every test file reuses, as an executable so that its code generation flags
// are the test executables' own (-fPIE). It does nothing.
int main() { return 0; }
