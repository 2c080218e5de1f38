# Writes OUT, a C source holding the bytes of IN as the array NAME and its length NAME_len
# (declared in HEADER): cmake -DIN=... -DOUT=... -DNAME=... -DHEADER=... -P cmake/embed.cmake
file(READ "${IN}" hex HEX)
string(LENGTH "${hex}" n)
math(EXPR len "${n} / 2")
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," body "${hex}")
file(WRITE "${OUT}.tmp" "/* Generated from ${IN} by cmake/embed.cmake: do not edit. */\n"
  "#include \"${HEADER}\"\n"
  "const unsigned char ${NAME}[] = {${body}};\n"
  "const size_t ${NAME}_len = ${len};\n")
file(RENAME "${OUT}.tmp" "${OUT}")
