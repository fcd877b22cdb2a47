# test_gelu compares with libm's double erfc and exp (td_tensor does not link libm itself).
target_link_libraries(tensor_test_gelu PRIVATE m)
