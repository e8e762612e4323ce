/* The web page served at / (src/server/page.html, embedded by CMake). */
#ifndef LP_SERVER_PAGE_H
#define LP_SERVER_PAGE_H

#include <stddef.h>

extern const unsigned char lp_server_page[];
extern const size_t lp_server_page_len;

#endif
