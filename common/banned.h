/* Poisons string functions that are easy to misuse; included by every .c file via the build. */
#ifndef DDP_COMMON_BANNED_H
#define DDP_COMMON_BANNED_H

#define DDP__BANNED(func) sorry_##func##_is_a_banned_function

#undef strcpy
#define strcpy(x, y) DDP__BANNED(strcpy)
#undef strcat
#define strcat(x, y) DDP__BANNED(strcat)
#undef strncpy
#define strncpy(x, y, n) DDP__BANNED(strncpy)
#undef sprintf
#define sprintf(...) DDP__BANNED(sprintf)

#endif
