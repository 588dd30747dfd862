module databusconsumer

go 1.19
