package httpfront

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hangGuard bounds a wait that only a bug makes long.
const hangGuard = 30 * time.Second
