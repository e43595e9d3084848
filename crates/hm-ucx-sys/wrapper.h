/* The ucp API (and the ucs status / thread-mode types it uses). */
#include <ucp/api/ucp.h>
