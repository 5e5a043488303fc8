// Package compassegress holds the repository's build assets that programs need at run
// time, so that each has one source of truth.
package compassegress

import _ "embed"

// ProxyDockerfile is Dockerfile.proxy, the one recipe of the sidecar image: `make image`
// builds it from the file, `compassctl env image build` and the e2e tests from this copy.
//
//go:embed Dockerfile.proxy
var ProxyDockerfile string
