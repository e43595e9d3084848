/* The ucp API (and the ucs status / thread-mode types it uses), and stdio's FILE functions that
 * ucp_ep_print_info needs a stream from. */
#include <stdio.h>
#include <ucp/api/ucp.h>
